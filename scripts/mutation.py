"""Mutation testing by hand-made mutants: does a behaviour change in the planner, reads, assembly
or order make some test fail?

Each mutant is one exact text replacement in one file of ``src/psdp``, made to change behaviour (a
wrong offset, a dropped condition, a changed constant). The script copies the repository to a
temporary directory once, then for each mutant applies it to that copy, runs a chosen set of
tests there with ``-x -q`` (the copy's ``src`` first on ``PYTHONPATH``, so pods started by the
tests import the mutant too), restores the file, and prints ``killed`` (with the first failing
test) or ``survived``. The working tree is never touched. Mutants that survive the
single-process tests are run again with the multi-process tests (``--pods``).

Usage (about 10 minutes on 2 cores)::

    .venv/bin/python scripts/mutation.py              # every mutant, then the pods for survivors
    .venv/bin/python scripts/mutation.py --only R1 A1  # some mutants
    .venv/bin/python scripts/mutation.py --list        # the mutants, without running anything
    .venv/bin/python scripts/mutation.py --skip tests/test_cli.py  # leave a test file out

This is a development tool, not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    """Replace ``old`` (which must occur exactly once) by ``new`` in ``src/psdp/<file>``."""

    name: str
    file: str
    old: str
    new: str
    what: str


MUTANTS = [
    # ------------------------------------------------------------------------------- order.py
    Mutant("O1", "_plan/index_shuffle.py", "f = (lo ^ key) * np.uint64(0x9E3779B97F4A7C15)",
           "f = (lo ^ key) * np.uint64(0x9E3779B97F4A7C17)", "a Feistel constant"),
    Mutant("O2", "_plan/order.py", "return splitmix64((splitmix64(self.seed & MASK64) ^ epoch) & MASK64)",
           "return splitmix64(splitmix64((self.seed + epoch) & MASK64))",
           "seed/epoch mixing: seed 0 epoch 1 == seed 1 epoch 0"),
    Mutant("O3", "_plan/index_shuffle.py", "_ROUNDS = 6", "_ROUNDS = 4", "fewer Feistel rounds"),
    Mutant("O4", "_plan/offsets.py", "return length // batch if self.drop_last else -(-length // batch)",
           "return length // batch if self.drop_last else length // batch + 1",
           "an extra step per run when B divides it"),
    Mutant("O5", "_plan/offsets.py", "rows = min(batch, self.line.run_end(offset) - offset)",
           "rows = min(batch, self.line.run_end(offset) - offset + 1)", "a step reads past its cut"),
    Mutant("O6", "_plan/offsets.py", "return n % batch != 0  # every later run is a whole epoch",
           "return n % batch == 0  # every later run is a whole epoch", "pads inverted"),
    Mutant("O7", "_plan/index_shuffle.py", "bits = max(2, (self.n - 1).bit_length())",
           "bits = max(2, self.n.bit_length())", "a Feistel domain twice too wide"),
    Mutant("O8", "_plan/index_shuffle.py", "todo = todo[out[todo] >= self.n]", "todo = todo[out[todo] > self.n]",
           "cycle walking lets N through"),
    Mutant("O9", "_plan/offsets.py", "at, offset = at + steps, min(cut, offset + steps * batch)",
           "at, offset = at + steps, cut", "drop_last's tail dropped by the wrong stage's batch"),
    Mutant("O10", "_plan/index_shuffle.py", "keys.append(k)", "keys.append(k & 0xFFFFFFFF)",
           "round keys cut to 32 bits"),
    Mutant("O11", "_plan/index_shuffle.py", "hi_bits, lo_bits = bits - bits // 2, bits // 2",
           "hi_bits, lo_bits = bits // 2, bits - bits // 2", "Feistel halves swapped (odd bits)"),
    Mutant("O12", "_plan/index_shuffle.py", "return (f ^ (f >> np.uint64(32))) * np.uint64(0xD6E8FEB86659FD93)",
           "return (f ^ (f >> np.uint64(31))) * np.uint64(0xD6E8FEB86659FD93)", "a Feistel shift"),
    Mutant("O13", "_plan/order.py", "return np.sort(ids) if self.shuffle else ids",
           "return ids", "a step's rows in permutation order, not sorted"),
    Mutant("O14", "_plan/offsets.py", "_, phantom = _walk(line, stages, first, offset, end)",
           "_, phantom = _walk(line, stages, first, offset, end - 1)", "a step skip one step short"),
    Mutant("O15", "_plan/offsets.py", "if step in self.unskipped:", "if False:",
           "a state saved past a skip starting at its step"),
    Mutant("O16", "_plan/offsets.py", "room = target - at - (1 if self.drop_last else 0)",
           "room = target - at", "whole epochs jumped up to a stage change with drop_last"),
    Mutant("O17", "_runtime/state.py", "**{name: given[name] for name in CHANGEABLE if name in given},",
           "**{name: given[name] for name in CHANGEABLE if name in given and name != 'drop_last'},",
           "a restore ignores a new drop_last"),
    # shuffles that stay permutations, and restores with another block shuffle: caught only by
    # oracles that stand alone (tests/shuffle_oracle.py, settings from the test)
    Mutant("O18", "_plan/order.py", "return splitmix64((splitmix64(self.seed & MASK64) ^ epoch) & MASK64)",
           "return splitmix64((splitmix64(self.seed & MASK64) ^ (epoch + 1)) & MASK64)",
           "every epoch takes the next epoch's key"),
    Mutant("O19", "_plan/index_shuffle.py", "    return tuple(keys)", "    return (keys[1], keys[0], *keys[2:])",
           "two Feistel rounds' keys swapped"),
    Mutant("O20", "_runtime/state.py", "saved = OrderOptions(**{name: state[name] for name in ORDER_FIELDS})",
           'saved = OrderOptions(**{name: state[name] for name in ORDER_FIELDS if name != "window_blocks"})',
           "a restore takes the default window_blocks, not the saved one"),
    Mutant("O21", "_runtime/state.py", "saved = OrderOptions(**{name: state[name] for name in ORDER_FIELDS})",
           'saved = OrderOptions(**{name: state[name] for name in ORDER_FIELDS if name != "io_block"})',
           "a restore of a block shuffle goes on with a full shuffle"),
    Mutant("O22", "_plan/offsets.py", "index = bisect.bisect_left(self.firsts, offset)",
           "index = bisect.bisect_right(self.firsts, offset)",
           "a skip starting at an epoch's start a run ends at is not seen (no padding planned)"),
    Mutant("O23", "_runtime/state.py",
           "    _check_past_offsets(order.skip_offsets, saved.skip_offsets, state[\"offset\"], state[\"step\"])\n",
           "", "a restore accepts a new skip of offsets already trained on"),
    Mutant("O24", "_runtime/state.py", "CHANGEABLE = (\"global_batch_size\", \"skip_steps\", \"skip_offsets\", \"drop_last\", \"epochs\")",
           "CHANGEABLE = (\"global_batch_size\", \"skip_steps\", \"skip_offsets\", \"drop_last\", \"epochs\", \"window_blocks\")",
           "a restore re-permutes the current epoch with a new window_blocks"),
    Mutant("O25", "_plan/offsets.py", "at, offset = _walk(line, stages, at, offset, first, anchors.append)",
           "at, offset = _walk(line, stages, at, offset, first)",
           "no run starts recorded before the last step skip (stages' starts lost)"),
    # -------------------------------------------------------------------------------- mesh.py
    Mutant("M1", "_plan/mesh.py", "index = index * layout.shape[dim] + coords[dim]",
           "index = index + coords[dim] * count", "axes of one dimension linearised minor-major"),
    Mutant("M2", "_plan/mesh.py", "rank[np.argsort(first)] = np.arange(first.size)",
           "rank[:] = np.arange(first.size)", "uids in sorted order, not first appearance"),
    Mutant("M3", "_plan/mesh.py", "blocks[-1].rows.stop == row_start and blocks[-1].columns == columns",
           "blocks[-1].rows.stop == row_start", "row blocks with different columns merge"),
    Mutant("M4", "_plan/mesh.py", "merged[-1] = (merged[-1][0], stop)", "merged[-1] = (start, stop)",
           "merging column ranges drops the first"),
    Mutant("M5", "_plan/mesh.py", "rows = (row_starts[:, None] + np.arange(self.sizes[0])).ravel()",
           "rows = (row_starts[:1, None] + np.arange(self.sizes[0])).ravel()",
           "a host's rows: only its first block"),
    Mutant("M6", "_plan/mesh.py", "distinct = np.unique(starts, axis=0)", "distinct = starts",
           "replicated boxes counted twice"),
    Mutant("M7", "_plan/mesh.py", "starts[:, dim] = index * size",
           "starts[:, dim] = index * size if dim < 2 else 0", "planner boxes at offset 0 beyond dim 1"),
    Mutant("M8", "_plan/mesh.py", "block_ids = block_ids * count + index", "block_ids = block_ids + index",
           "box ids collide"),
    Mutant("M9", "_plan/mesh.py", "held = _held_sets(layout.ranks.ravel(), block_ids, layout.num_processes)",
           "held = _held_sets(layout.ranks.ravel(), starts[:, 0], layout.num_processes)",
           "uids ignore columns"),
    Mutant("M10", "_plan/mesh.py", "            if name in seen:", "            if False:",
           "an axis twice in a spec is accepted"),
    Mutant("M11", "_plan/mesh.py", "held = np.unique(dp[layout.process_index.ravel() == p])",
           "held = np.unique(dp[layout.process_index.ravel() != p])",
           "local_device_mapping of the other processes"),
    Mutant("M12", "_plan/mesh.py", "held[owner, np.arange(pairs.size) - first[owner]] = key",
           "held[owner, 0] = key", "held sets keep one key"),
    Mutant("M13", "_plan/mesh.py", "    if len(set(axes)) != len(axes):", "    if False:",
           "batch_axes naming an axis twice accepted"),
    Mutant("M14", "_plan/mesh.py", "whole_rows = len(shape) < 2 or sizes[1] == shape[1]",
           "whole_rows = len(shape) < 2", "row blocks list columns of whole rows"),
    Mutant("M15", "_plan/mesh.py", "all(is_int(n) and n >= 1 for n in shape)",
           "all(is_int(n) and n >= 0 for n in shape)", "a zero dimension accepted"),
    # ------------------------------------------------------------------------------ layout.py
    Mutant("L1", "_plan/layout.py", "data_row = np.where(row_in_tile == 0, tile_row, dp - 1 - tile_row)",
           "data_row = np.where(row_in_tile == 0, tile_row, tile_row + dp // 2)",
           "noncontiguous fold changed"),
    Mutant("L2", "_plan/layout.py", "procs = (np.arange(total) // per).reshape(shape)",
           "procs = (np.arange(total) % num_processes).reshape(shape)", "contiguous becomes striped"),
    Mutant("L3", "_plan/layout.py", "procs = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(devices)",
           "procs = np.vectorize(lambda d: 0, otypes=[np.int64])(devices)",
           "from_mesh ignores processes"),
    Mutant("L4", "_plan/layout.py", "int(process_index) not in self.processes:",
           "int(process_index) not in (*self.processes, self.num_processes):", "process_index P accepted"),
    # L5 ("sparse process numbers accepted") is gone: a mesh over some processes of a job (e.g.
    # processes 0 and 2) is now valid, numbered by rank; L9 mutates that numbering instead.
    Mutant("L6", "_plan/layout.py", "grid.flat[position] = by_process[p][taken[p]]",
           "grid.flat[position] = by_process[p][-1 - taken[p]]",
           "build_mesh places a process's devices in reverse order"),
    Mutant("L7", "_plan/layout.py", "        if counts.min() != counts.max():", "        if False:",
           "unbalanced layouts accepted"),
    Mutant("L8", "_plan/layout.py", "host = tile_row * tiles_across + col // half",
           "host = tile_row + (col // half) * (dp // 2)", "noncontiguous hosts numbered column-major"),
    Mutant("L9", "_plan/layout.py", "ranks = ranks.reshape(procs.shape)", "ranks = procs.copy()",
           "ranks are the raw process numbers (a mesh over processes 0 and 2)"),
    # --------------------------------------------------------------------------- partition.py
    Mutant("P1", "_plan/partition.py", "unit = math.lcm(*shards) if shards else 1",
           "unit = max(shards) if shards else 1", "physical batch by max, not lcm"),
    Mutant("P2", "_plan/partition.py", "return math.prod(mesh.shape[a] for a in axes)",
           "return mesh.shape[axes[0]]", "batch shards: first axis only"),
    Mutant("P3", "_plan/partition.py", "return PartitionSpec(tuple(mesh.axis_names))",
           "return PartitionSpec(tuple(mesh.axis_names)[::-1])", "full: axes reversed"),
    Mutant("P4", "_plan/partition.py", "    return PartitionSpec(spec_entry(axes))\n\n\ndef resolve_spec",
           "    return PartitionSpec(axes[0])\n\n\ndef resolve_spec",
           "default batch spec: first batch axis only"),
    Mutant("P5", "_plan/partition.py", 'batch_spec.get(k, "batch")', 'batch_spec.get(k, "replicated")',
           "leaves missing from a dict batch_spec replicated"),
    Mutant("P6", "_plan/partition.py", "{1: AxisHalo(halo)} if halo and k in sequence else {}",
           "{1: AxisHalo(halo)} if halo and ndims[k] >= 2 else {}",
           "halo on leaves not sharded along dimension 1"),
    Mutant("P7", "_plan/partition.py", "            return PartitionSpec(spec_entry(axes_of(batch_axes)))",
           "            return PartitionSpec(axes_of(batch_axes)[-1])", "batch_axes: last axis only"),
    Mutant("P8", "_plan/partition.py", "        if unknown:\n            raise ValueError(\n                f\"batch_spec names leaves",
           "        if False:\n            raise ValueError(\n                f\"batch_spec names leaves",
           "batch_spec naming unknown leaves accepted"),
    # ------------------------------------------------------------------------------- reads.py
    Mutant("R1", "_plan/reads.py", "WindowSlice(key, 0, None if same else np.searchsorted(union, rows))",
           "WindowSlice(key, 0, None if same else np.arange(len(rows)))",
           "hole 1: a whole-row leaf's pick out of the union read"),
    Mutant("R2", "_plan/reads.py", "if key not in r.columns and np.array_equal(r.positions, rows)",
           "if np.array_equal(r.positions, rows)",
           "hole 4: a second column window of the same rows overwrites the first"),
    Mutant("R3", "_plan/reads.py", "if periodic and len(runs) > 1 and runs[0][0] == 0 and runs[-1][-1] == size - 1:",
           "if False:", "the two ends of a periodic dimension are not one range"),
    Mutant("R4", "_plan/reads.py", "None if whole_read else _parts(leaf, read),", "None,",
           "every window takes the whole read"),
    Mutant("R5", "_plan/reads.py", "per_shard = -(-batch_size // len(fed))",
           "per_shard = batch_size // len(fed) + 1", "feeding: one position too many per shard"),
    Mutant("R6", "_plan/reads.py", "positions = (fed[:, None] * per_shard + np.arange(per_shard)).ravel()[:batch_size]",
           "positions = (fed[:, None] * per_shard + np.arange(per_shard)).ravel()[-batch_size:]",
           "feeding: the last B positions are real"),
    Mutant("R7", "_plan/reads.py", "return int(uids[layout.rank(process_index)]), len(sets)", "return int(uids[0]), len(sets)",
           "every host reads stream shard 0"),
    Mutant("R8", "_plan/reads.py", "if rows.min() != rows.max() or rows.min() == 0:", "if rows.min() == 0:",
           "streams at different rates accepted"),
    Mutant("R9", "_plan/reads.py", "in_box = [np.cumsum(k) - 1 for k in keep]",
           "in_box = [np.arange(len(k)) for k in keep]",
           "a window's entries placed by their range, not their box"),
    Mutant("R10", "_plan/reads.py", "if len(firsts) != 1 or None in firsts:", "if None in firsts:",
           "feeding with differently split leaves accepted"),
    Mutant("R11", "_plan/reads.py", "fed = np.unique(index[np.isin(layout.process_index.ravel(), chosen)])",
           "fed = np.unique(index[np.isin(layout.process_index.ravel(), chosen[:1])])",
           "feeding: only the first feeding process"),
    Mutant("R12", "_plan/reads.py", "same = np.array_equal(union, rows)", "same = True",
           "every whole-row leaf takes the whole union read"),
    Mutant("R13", "_plan/reads.py", "None if whole_window and len(rows) == n_rows[w] else _parts(leaf, window),",
           "None if whole_window else _parts(leaf, window),",
           "a window whose rows span several reads taken whole from each"),
    Mutant("R14", "_plan/reads.py", "for rows, members in row_classes([w.rows for w in leaf.windows]):",
           "for rows, members in [(w.rows, [i]) for i, w in enumerate(leaf.windows)]:",
           "windows whose rows overlap in part read apart (shared rows read twice)"),
    # ------------------------------------- _runtime/assembly.py and _plan/windows.py
    Mutant("A1", "_runtime/assembly.py", "(index[d].start or 0) // n for d, n in zip(self.windowed, extents, strict=True)",
           "(index[d].start or 0) // n for d, n in zip(self.windowed[::-1], extents, strict=True)",
           "hole 2: a device box located by its dimensions in the wrong order"),
    Mutant("A2", "_plan/windows.py", "shard = tuple(box[d].start // w for d, w in zip(windowed, widths, strict=True))",
           "shard = tuple(box[d].start // widths[0] for d in windowed)",
           "hole 2: every windowed dimension cut at the first one's width"),
    Mutant("A3", "_runtime/assembly.py", "return buffers[window][offset : offset + stop - start]",
           "return buffers[window][: stop - start]", "a box's rows from its window's first row"),
    Mutant("A4", "_plan/windows.py", "else (x >= 0) & (x < size)", "else (x >= 0) & (x <= size)",
           "a pad halo takes the entry past the end (wrapped to entry 0)"),
    Mutant("A5", "_plan/windows.py", "row_slices = list({s.start: s for s in all_slices}.values())",
           "row_slices = all_slices", "rows of blocks differing beyond dim 1 read twice"),
    Mutant("A6", "_plan/windows.py", "locate[(s.start, shard)] = (len(windows), int(np.searchsorted(rows, s.start)))",
           "locate[(s.start, shard)] = (len(windows), 0)", "every row block of a window at offset 0"),
    Mutant("A7", "_plan/windows.py", "buffer = np.full(self.window_shape(index), pad_value, self.dtype)",
           "buffer = np.zeros(self.window_shape(index), self.dtype)", "halo padding ignores pad_value"),
    Mutant("A8", "_runtime/assembly.py", "self.global_shape[d] // c for d, c in zip(self.windowed, self.shards, strict=True)",
           "self.source_shape[d] // c for d, c in zip(self.windowed, self.shards, strict=True)",
           "device boxes located by the unhaloed extent"),
    Mutant("A9", "_plan/windows.py", "rows = source_rows[np.searchsorted(positions, window.rows)]",
           "rows = source_rows[: len(window.rows)]", "fill takes the first rows, not the window's"),
    Mutant("A10", "_plan/windows.py", "    if halo <= width:\n        return", "    if halo <= width + 1:\n        return",
           "a halo wider than a shard accepted"),
    Mutant("A11", "_plan/windows.py", "if counts[d] > 1 or halos.get(d, AxisHalo(0)).width", "if counts[d] > 1",
           "a halo on a dimension that is not sharded ignored"),
    Mutant("A12", "_runtime/assembly.py", "for d in devices], devices)", "for d in devices], devices[::-1])",
           "the batched put sends each box to another device"),
    # ------------------------------------- what the fixed weak tests guard (prefetch.py)
    Mutant("W1", "_runtime/prefetch.py", "self._observer(step, self.last_wait_s, ready)",
           "self._observer(step, 0.0, ready)", "the observer is told no wait"),
    Mutant("W2", "_runtime/prefetch.py", "            ready = self._ready()\n",
           "            ready = min(self._ready(), 1)\n", "the ready count capped at one"),
    # ------------- the holes outside those modules (_runtime/step_reader.py, consistency.py)
    Mutant("H3", "_runtime/step_reader.py", "else take_box(np.asarray(got[key]), request.columns[key])",
           "else take_box(np.asarray(got[key]), slice(0, request.columns[key].stop - request.columns[key].start) if isinstance(request.columns[key], slice) else request.columns[key])",
           "hole 3: a source without read_window loses the column offset"),
    Mutant("H5", "_integration/consistency.py", "    for number, name in enumerate(names):",
           "    for number, name in enumerate(names[:1]):", "hole 5: check_consistency checks one leaf"),
    Mutant("C1", "_integration/consistency.py", "if not np.array_equal(data, want, equal_nan=data.dtype.kind in \"fc\"):",
           "if not np.array_equal(data[:1], want[:1], equal_nan=data.dtype.kind in \"fc\"):",
           "a shard compared with its expected rows by its first row only"),
    Mutant("C2", "_integration/consistency.py", "*_fingerprint(data), ok]", "*_fingerprint(data[:1]), ok]",
           "replicas compared by their first row only"),
    Mutant("C3", "_integration/consistency.py", 'entry = x % n if halo.boundary == "periodic" else x + reach',
           'entry = np.clip(x, 0, n - 1) if halo.boundary == "periodic" else x + reach',
           "check_consistency expects a periodic halo clamped, not wrapped"),
    Mutant("E1", "sources/stores/errors.py", 'if message.split(":", 1)[0].strip() in TRANSIENT_STATUS:',
           "if any(code in message for code in TRANSIENT_STATUS):",
           "a status word anywhere in an error message (a path) read as transient"),
    # ------------- the runtime split out of the loader (issue #14): step reader, feeds, plan
    Mutant("S1", "_runtime/step_reader.py", "buffer = buffer.copy()", "buffer = buffer",
           "a borrowed buffer is not copied out of the source's memory"),
    Mutant("S2", "_runtime/step_reader.py", "out[key][real] = got[key]",
           "out[key][: int(real.sum())] = got[key]", "real rows packed before the padding"),
    Mutant("S3", "_runtime/step_reader.py", "if data.shape != expected or data.dtype != dtype.source:",
           "if data.shape != expected:", "a read in another dtype accepted"),
    Mutant("F1", "_runtime/feeds.py", "if reader is None or reader.consumed != first:",
           "if reader is None:", "a stream jump does not reopen the shard"),
    Mutant("F2", "_runtime/feeds.py", "if n == 0 or self.drop_last)", "if n == 0)",
           "drop_last keeps a stream's short final batch"),
    Mutant("F3", "_runtime/feeds.py", "ids[plan.real_positions[: info.rows]] = self.order.rows(info)",
           "ids[: info.rows] = self.order.rows(info)",
           "the order's ids ignore the real positions (feeding_processes)"),
    Mutant("F4", "_runtime/feeds.py", "ids[real[:got]] = np.arange(got)",
           "ids[real[-got:]] = np.arange(got)", "a short stream batch fills its last positions"),
    Mutant("LP1", "_plan/loader_plan.py", "padded = physical > batch or ends_short",
           "padded = physical > batch", "a short final batch is not masked"),
    Mutant("LP2", "_plan/loader_plan.py", "real_read_positions=np.intersect1d(read_positions, real),",
           "real_read_positions=read_positions,", "a stream host takes elements for pad positions"),
    Mutant("B1", "_runtime/assembly.py", "real = (ids != PAD)[self.mask.plan.rows]",
           "real = (ids != PAD)[: len(self.mask.plan.rows)]",
           "the mask of the first rows, not this host's"),
    Mutant("ST1", "_runtime/state.py", "if getattr(group, f.name) != getattr(defaults, f.name)",
           "if False", "restore ignores the fields of an order= group"),
    Mutant("ST2", "_runtime/state.py",
           '"io_block": order.io_block if feed.order is None else feed.order.io_block,',
           '"io_block": order.io_block,', "the state forgets the block a source suggested"),
    Mutant("F5", "_runtime/feeds.py", 'block = getattr(source, "io_block", None)', "block = None",
           "a source's suggested block ignored: a packed window planned per row"),
    Mutant("B2", "_runtime/assembly.py", "        if not real.all():\n", "        if False:\n",
           "a padded step given the all-real mask"),
    # ------------- spatial domains: periodic halos, uneven domains, boxes, pieces, masks
    Mutant("SP1", "_plan/windows.py", "held = x[data] % size", "held = np.clip(x[data], 0, size - 1)",
           "a periodic halo clamps to the edge instead of wrapping"),
    Mutant("SP2", "_plan/windows.py", "-(-n // c) * c if pad_uneven and d else n", "n // c * c if pad_uneven and d else n",
           "an uneven domain cut down to a multiple, not padded"),
    Mutant("SP3", "_plan/reads.py", "for grid in sorted(shard_grids(covered), key=min) if covered else [set()]:",
           "for grid in [covered]:",
           "windows that are not a grid read as their bounding box (entries read that no device holds)"),
    Mutant("SP4", "_plan/windows.py", "where[d] = axis.before + np.arange(len(axis.indices))[parts[d - 1]]",
           "where[d] = np.arange(len(axis.indices))[parts[d - 1]]",
           "a window's pieces placed without its leading padding"),
    Mutant("SP5", "_runtime/step_reader.py", "if entry.into is not None:", "if False:",
           "each piece of a window taken as the whole window"),
    Mutant("SP6", "sources/stores/tensorstore.py", "return array.oindex[(ids, *box)]", "return array[(ids, *box)]",
           "a box with a periodic wrap read with vectorised indexing"),
    Mutant("SP7", "_runtime/assembly.py", "(coordinate >= 0) & (coordinate < leaf.source_shape[d])",
           "(coordinate >= 0) & (coordinate < leaf.plan.global_shape[d])",
           "an uneven domain's padding inside the domain mask"),
    Mutant("SP8", "_runtime/assembly.py", "one = (position < h) | (position >= extent - h)",
           "one = (position < h) | (position > extent - h)", "the last halo position not in the halo mask"),
    Mutant("SP9", "_plan/loader_plan.py", "if size % count:", "if False:",
           "pad_value unchecked for an uneven domain's padding"),
    Mutant("SP10", "_plan/loader_plan.py", 'if not halos or (list(halos) == [1] and halos[1].boundary == "pad"):',
           "if not halos:", "hosts agree on halos in another form than states saved them"),
    Mutant("SP11", "_plan/windows.py", "out = np.take(out, part, axis=d)", "out = np.take(out, np.sort(part), axis=d)",
           "a periodic wrap cut in ascending order"),
    Mutant("SP12", "_plan/option_checks.py", "    if dim == 0:\n", "    if False:\n",
           "a halo on the batch dimension reaches the planner"),
    # ------------------------------------------------------------- token sequences (tokens.py)
    Mutant("T1", "sources/views/tokens.py", "ids = (pieces.docs.doc + 1).astype(", "ids = (pieces.docs.doc).astype(",
           "the first document's segment id is padding's"),
    Mutant("T2", "sources/views/tokens.py", "& (self.within + self.size > self.length)",
           "& (self.within + self.size >= self.length)", "a document's last token taken for its EOS"),
    Mutant("T3", "sources/views/tokens.py", "begin[touched] = self.docs.start[firsts] + self.within[firsts]",
           "begin[touched] = self.docs.start[firsts] + np.maximum(self.within[firsts], 1) - 1",
           "a row's tokens read from one token early"),
    Mutant("T4", "sources/views/tokens.py", "got = self._window(ids * self.seq_len + first, stop - first, keys)",
           "got = self._window(ids * self.width + first, stop - first, keys)",
           "rows of seq_len + 1 tokens laid end to end (targets overlap no more)"),
    Mutant("T5", "sources/views/tokens.py", "lo, hi = np.clip(starts, 0, end), np.clip(starts + width, 0, end)",
           "lo, hi = np.clip(starts, 0, end), np.clip(starts + width, 0, end + 1)",
           "a position past the stream's end counted as inside"),
    Mutant("T8", "sources/views/tokens.py", "if self._eos or SEGMENT_IDS in names or POSITIONS in names:",
           "if True:", "input_ids alone (no EOS) searches documents it does not need"),
    Mutant("T9", "sources/views/tokens.py", "        docs = store.documents_touching(lo, hi, eos=eos)",
           "        np.searchsorted(lo, np.arange(int((hi - lo).sum())))\n"
           "        docs = store.documents_touching(lo, hi, eos=eos)",
           "a search per token"),
    # ------------------------------------------------ the document index (document_index.py)
    Mutant("DI1", "sources/documents/index.py", "marks.append(values[first - low :: stride].copy())",
           "marks.append(values[first - low :: stride])", "the pass keeps every step alive (O(D) memory)"),
    Mutant("DI2", "sources/documents/index.py", "return take(d) + e * (d - empty_before)",
           "return take(d) + e * d", "empty documents before a block given an EOS"),
    Mutant("DI3", "sources/documents/index.py", "    falls[starts[1:] - 1] = False  # from one run to the next is no step\n",
           "", "the step between two runs of blocks read as a document"),
    Mutant("DI4", "sources/documents/index.py", "        wrong = values != self.marks[blocks]\n",
           "        wrong = values != values\n", "moved marks (a stale index) go unseen"),
    Mutant("DI5", "sources/documents/index.py",
           'group = np.searchsorted(groups, positions, side="right") - 1',
           'group = np.searchsorted(groups, positions, side="left") - 1',
           "a position at a group's first mark searched in the block before"),
    Mutant("DI7", "sources/documents/index.py", "at_or_below = (marks[rows] <= positions[:, None])",
           "at_or_below = (marks[rows] < positions[:, None])",
           "a position at a block's first document searched in the block before"),
    Mutant("DI8", "sources/documents/index.py", "        probe = np.minimum(low + step, end)\n",
           "        probe = low + step\n", "a search in a block probes past its end (the last block)"),
    Mutant("DI6", "sources/documents/index.py", "plain = not e or index.empty_free(blocks)", "plain = True",
           "empty documents inside a block not counted under EOS"),
    Mutant("T6", "sources/documents/index.py", "stream_lengths = lengths + e * (lengths > 0)",
           "stream_lengths = lengths + e", "an empty document gets an EOS"),
    # -------------------------------------------------------- packing (packing.py, packed.py)
    Mutant("PK1", "_plan/packing.py", "        if length > room or held == cap:\n",
           "        if length >= room or held == cap:\n",
           "greedy opens a sequence when the item fits exactly"),
    Mutant("PK1b", "_plan/packing.py", "        if length > room or held == cap:\n",
           "        if length > room:\n", "greedy ignores the cap on segments"),
    Mutant("PK1c", "_plan/packing.py", "            if held[b] == cap:\n",
           "            if held[b] == cap + 1:\n", "best fit lets a row past the cap on segments"),
    Mutant("PK1e", "_plan/packing.py", "            if held[node - size] == cap:\n",
           "            if held[node - size] == cap + 1:\n", "first fit lets a row past the cap on segments"),
    Mutant("PK1d", "_plan/packing.py", "        ordered = np.minimum(ordered, seq_len)\n",
           "        pass\n", "truncate splits long documents"),
    Mutant("PK2", "_plan/packing.py", "room = length + (above & -above).bit_length() - 1",
           "room = length + (above & -above).bit_length()", "best fit picks the wrong room"),
    Mutant("PK3", "_plan/packing.py", "item_len = np.minimum(seq_len, np.repeat(lengths, count) - item_start)",
           "item_len = np.minimum(seq_len - 1, np.repeat(lengths, count) - item_start)",
           "split pieces one token short"),
    Mutant("PK4", "sources/views/packed.py", "segment = piece - plan.seq_starts[ids[rows]] + 1",
           "segment = piece - plan.seq_starts[ids[rows]]", "the first segment numbered 0 (padding's)"),
    Mutant("PK5", "sources/views/packed.py", "            skipped = begin - column\n",
           "            skipped = 0 * column\n", "positions restart at a window's first column"),
    Mutant("PK7", "sources/views/packed.py", "return max(1, len(self) // self.plan.key.num_windows)",
           "return max(1, len(self))", "the suggested block is the whole epoch, not a window's"),
    Mutant("PK6", "sources/views/packed.py", "end = np.minimum(column + count, high)",
           "end = np.minimum(column + count, high - 1)",
           "a window's last column never read"),
    # ------------------------------------------------------ mixtures (mixture.py, both folders)
    Mutant("MX1", "_plan/mixture.py", "earlier = self.before[stage, source] + (block - self.first_blocks[stage]) * counts",
           "earlier = self.before[stage, source] + block * counts",
           "a source's samples counted from block 0, not from its stage's first block"),
    Mutant("MX2", "_plan/mixture.py", 'end = np.searchsorted(self.ends, key, side="right")',
           'end = np.searchsorted(self.ends, key, side="left")', "a slot on a source's end given to that source"),
    Mutant("MX3", "_plan/mixture.py", "epoch_keys = _mix(self.source_keys[source], epoch)",
           "epoch_keys = _mix(self.source_keys[source], 0 * epoch)", "every epoch of a source in one order"),
    Mutant("MX3b", "_plan/mixture.py", "        if not self.shuffle:\n            rank = self._ranks_in_order(block, position)\n",
           "", "an unshuffled block hands a source's rows out in its permuted order"),
    Mutant("MX3c", "_plan/mixture.py", "by_group = np.argsort(group, kind=\"stable\")",
           "by_group = np.argsort(group, kind=\"quicksort\")",
           "an unshuffled block's rows of a source in an unstable order"),
    Mutant("MX4", "_plan/mixture.py",
           'past = [s for s in saved["stages"] if s[0] < offset]\n        mine = [s for s in now["stages"] if s[0] < offset]',
           'past = [s for s in saved["stages"] if s[0] < offset - 1]\n        mine = [s for s in now["stages"] if s[0] < offset - 1]',
           "a stage whose first sample was read just before the resume offset may change"),
    Mutant("MX6", "_plan/mixture.py", "for index in range(max(len(past), len(mine))):",
           "for index in range(min(len(past), len(mine))):",
           "a stage added or removed before the resume offset goes unnoticed"),
    Mutant("MX5", "sources/views/mixture.py", "by_source = np.lexsort((rows, source))",
           'by_source = np.argsort(source, kind="stable")', "a source's rows read unsorted (a scattered gather)"),
    Mutant("MX9", "_plan/mixture.py", "error = 2 * (sources + 5) * 2.0**-53 * block",
           "error = 0.0", "stage counts trusted to floating point without its error bound"),
    Mutant("MX7", "_plan/mixture.py", 'for name in ("block_size", "seed", "shuffle"):',
           'for name in ("block_size", "seed"):', "a restore may change shuffle"),
    Mutant("MX8", "_plan/mixture.py", "if stages[index][0] <= stages[index - 1][0]:",
           "if stages[index][0] < stages[index - 1][0]:", "two stages with the same start"),
    # ------------------------------------- leaf order, read_window boxes, token views and stores
    Mutant("LO1", "_runtime/assembly.py", "return self._wrap(in_leaf_order(batch))",
           "return self._wrap(batch)", "the mask appended after the sorted leaves"),
    Mutant("LO2", "_plan/loader_plan.py", "        first_row = in_leaf_order(first_row)", "        pass",
           "the mask follows the first leaf the caller listed, not the first by name"),
    Mutant("RW1", "_runtime/step_reader.py",
           "boxes = {key: () if box is None else box for key, box in request.columns.items()}",
           "boxes = request.columns", "whole-row leaves given to read_window as None, no documented box"),
    Mutant("T7", "sources/views/tokens.py", "self._len = max(0, (self.stream_tokens - int(targets)) // self.seq_len)",
           "self._len = max(0, self.stream_tokens // self.seq_len)",
           "with targets, a last row whose target is an unmasked pad"),
    Mutant("DS1", "sources/documents/store.py", "return np.array(array[starts[0] : stops[0]])",
           "return array[starts[0] : stops[0]]", "one range read as a view of the store"),
    Mutant("DS2", "sources/documents/store.py", "    if first != 0:\n", "    if False:\n",
           "offsets whose entry 0 is Levanter's document count taken for a store"),
    Mutant("DS3", "sources/documents/store.py", '        index.spot_check(read, "", "")\n', "",
           "a saved index of offsets changed since is trusted"),
    Mutant("DS4", "sources/documents/store.py", "        if size and (stops - starts == size).all():",
           "        if size and (stops - starts == size).any():", "ranges of several lengths gathered as one"),
    Mutant("DS5", "sources/documents/store.py", "    if unknown:\n        raise ValueError(\n            f\"leaves={names!r}",
           "    if False:\n        raise ValueError(\n            f\"leaves={names!r}", "leaves= naming a leaf it lacks"),
    # -------------------------------------------------- finite loaders (epochs, eval_loader)
    Mutant("EV1", "_plan/offsets.py", "if self.info(middle).offset >= offset:",
           "if self.info(middle).offset > offset:", "a finite run ends a step late"),
    Mutant("EV2", "_runtime/feeds.py", "if self.end_step is not None and step >= self.end_step:",
           "if self.end_step is not None and step > self.end_step:", "one batch past the last epoch"),
    Mutant("EV3", "_runtime/state.py", 'finite = {} if order.epochs is None else {"epochs": order.epochs}',
           "finite = {}", "a restored finite loader is endless"),
    Mutant("EV5", "_runtime/evaluation.py", '**{"epochs": 1, "shuffle": False, **options}',
           '**{"epochs": 1, **options}', "an eval loader shuffled"),
    Mutant("EV6", "_runtime/loader.py", "return max(0, end - self.start_step)", "return end",
           "a restored loader's length counts the steps before its start"),
    Mutant("EV7", "_runtime/feeds.py", "else self.offsets.end_step(order.epochs)",
           "else self.offsets.end_step(1)", "epochs=2 ends after one pass"),
    # ----------------------------------------------------------------------------- prepare/
    Mutant("PP1", "sources/documents/parts.py",
           "np.asarray(future.result(), np.int64) + self.first_token[part]",
           "np.asarray(future.result(), np.int64)",
           "a part's offsets not shifted by the tokens before it"),
    Mutant("PP2", "prepare/parts.py", "json.dumps(meta, indent=1, sort_keys=True)",
           "json.dumps(meta, indent=1)", "an appended manifest in another key order"),
    Mutant("PP3", "prepare/parts.py", 'elif meta.get("key") != dict(key):', "elif False:",
           "another tokenizer mixed into a store"),
    Mutant("PP4", "prepare/parts.py", "                    shutil.rmtree(leftover, ignore_errors=True)",
           "                    pass", "a killed part's staging directory left"),
    Mutant("PP5", "prepare/parts.py", '            if name.startswith("index-") and name != meta.get("index"):',
           "            if False:", "an index of another size left"),
    Mutant("PP6", "prepare/__init__.py", "            if uncommitted == every:", "            if False:",
           "parts committed only at the end"),
    Mutant("PP7", "prepare/tasks.py", "skipped[kind] = skipped.get(kind, 0) + 1", "skipped[kind] = 1",
           "skipped records miscounted"),
    Mutant("PP8", "prepare/tokenize.py", "head = [] if self.bos is None else [self.bos]", "head = []",
           "BOS dropped"),
    Mutant("PP9", "prepare/readers.py", "enumerate(lines, start=1)", "enumerate(lines)",
           "jsonl line numbers from 0"),
    Mutant("PP10", "sources/documents/format.py",
           'names = [u["part"] for u in meta["units"] if meta["parts"][u["part"]]["num_documents"]]\n    paths',
           'names = [u["part"] for u in meta["units"][::-1] if meta["parts"][u["part"]]["num_documents"]]\n    paths',
           "parts read in another order"),
    # ------------------------------------------------------ the data config and its mixture
    Mutant("QC1", "_integration/data_config.py",
           'by_step = [i for i, s in enumerate(stages) if s.step is not None and s.step < state["step"]]',
           'by_step = [i for i, s in enumerate(stages) if s.step is not None and s.step < state["step"] - 1]',
           "a stage inserted just before the resume step moved to the resume offset"),
    Mutant("QC2", "_integration/data_config.py",
           'by_step = [i for i, s in enumerate(stages) if s.step is not None and s.step < state["step"]]',
           'by_step = [i for i, s in enumerate(stages) if s.step is not None and s.step <= state["step"]]',
           "a restore that changes the stage starting at the resume step refused"),
    Mutant("QC3", "_runtime/evaluation.py", "shuffle=False if order.shuffle is None else order.shuffle,",
           "shuffle=True if order.shuffle is None else order.shuffle,", "eval sets shuffled"),
    Mutant("QC4", "_integration/data_config.py",
           "batch = self.eval_batch_size or self.order.global_batch_size",
           "batch = self.order.global_batch_size or self.eval_batch_size",
           "eval_batch_size ignored when global_batch_size is set"),
    Mutant("QC5", "_runtime/evaluation.py", "epochs=1 if order.epochs is None else order.epochs,",
           "epochs=1,", "epochs in an OrderOptions group ignored by eval_loader"),
    Mutant("QC6", "_runtime/evaluation.py", '**{"epochs": 1, "shuffle": False, **options}',
           '**{**options, "epochs": 1, "shuffle": False}', "epochs as a keyword ignored by eval_loader"),
    Mutant("QC7", "_plan/mixture.py", "return Fraction(repr(float(weight)))",
           "return Fraction(float(weight))", "weights counted as binary floats (0.3 : 0.1 != 3 : 1)"),
    Mutant("QC8", "_integration/data_config.py",
           "listed = sorted(self.sources) if names is None else list(names)",
           "listed = list(self.sources) if names is None else list(names)",
           "the mixture's slots follow the listed (dumped) order of the sources"),
    Mutant("QC9", "_integration/data_config.py",
           "names = saved if sorted(saved) == sorted(self.sources) else None",
           "names = None", "a state saved in the listed order resumed in sorted order"),
    Mutant("QC10", "_plan/mixture.py", 'if saved.get("kind") == _BINARY_KIND:', "if False:",
           "a state of binary counts resumed where today's counts differ"),
    Mutant("QC11", "_integration/loader_config.py", "    if isinstance(axes, str):\n        try:",
           "    if False:\n        try:", "the text form of --mesh.axes not parsed"),
    Mutant("PP11", "prepare/tokenize.py", "if vocab_size <= np.iinfo(dtype).max + 1:",
           "if vocab_size <= np.iinfo(dtype).max:", "a dtype one id too wide"),
    # ---------------------------------- Levanter caches, indexes, targets, config eos (issue 35)
    Mutant("QX1", "sources/stores/levanter_cache.py", 'if ledger.get("is_finished") is not True:',
           'if ledger.get("is_finished", True) is not True:',
           "a Levanter ledger without is_finished read as finished"),
    Mutant("QX2", "sources/views/pack_index.py", "if got == (FORMAT, VERSION) else None",
           "if got[0] == FORMAT else None", "a pack index of another format version loaded"),
    Mutant("QX3", "sources/documents/index.py", "    wrong = counted[at_marks] != index.nonempty[needed]\n",
           "    wrong = counted[at_marks] != counted[at_marks]\n",
           "a stale index's count of non-empty documents trusted"),
    Mutant("QX4", "sources/documents/index.py",
           "bad = (lengths < 0) | (stop > index.num_tokens) | (lengths > index.longest)",
           "bad = lengths < 0", "a document longer than the index says read from a stale index"),
    Mutant("QX5", "sources/documents/index.py",
           "        if (self.num_documents, self.num_tokens) != (num_documents, num_tokens):\n",
           "        if False:\n", "an index of another size taken for the offsets'"),
    Mutant("QX6", "sources/views/packed.py", "computed[TARGETS] = store.leaves[TOKENS]",
           "computed[TARGETS] = np.dtype(np.int32)", "the targets leaf declared int32, not the ids' dtype"),
    Mutant("QX7", "prepare/tokenize.py",
           "    if isinstance(token, str) and token.isascii() and token.isdigit():\n        token = int(token)\n",
           "", 'a config eos: "2" taken as the token "2", not the id --eos 2 recorded'),
    Mutant("QI1", "prepare/readers.py", "        row = unit.row_start\n", "        row = 0\n",
           "a Parquet/Arrow part's rows named from 0, not from its first row in the file"),
    Mutant("QI2", "prepare/readers.py", "    if batch.values or batch.bad:\n        yield batch",
           "    if batch.values:\n        yield batch", "malformed records at a file's end not counted"),
    Mutant("QI3", "prepare/parts.py", "if result.num_documents and leaves is None:",
           "if leaves is None:", "a part of only empty texts, first, sets the store's leaves"),
    Mutant("QI4", "prepare/readers.py", "            if self.decoder is not None:\n                unit =",
           "            if False:\n                unit =", "a truncated .gz/.zst read as a short file"),
    Mutant("QI5", "prepare/readers.py", "self.left = self.decoder.unused_data", 'self.left = b""',
           "a .gz/.zst read only to the end of its first member (frame)"),
    Mutant("QI6", "prepare/readers.py", "if raw.read(len(_ARROW_EOS)) != _ARROW_EOS:", "if False:",
           "an Arrow stream cut between batches read as a short one"),
    Mutant("QI7", "prepare/readers.py", "raw_line = raw_line.removeprefix(codecs.BOM_UTF8)",
           "pass", "a UTF-8 BOM makes a jsonl file's first record malformed"),
    # ------------- object stores: endpoints, reach, write retries (issue 35, items 11, 16)
    Mutant("QC12", "_plan/mixture.py", "and _same_stage(past[index], mine[index]):",
           "and past[index] == mine[index]:", "a restore refuses proportional stage weights"),
    Mutant("QR8", "prepare/parts.py", "            if got.state == \"value\" and bytes(got.value) == body:",
           "            if False:", "a manifest commit whose reply was cut retried as if it had not landed"),
    Mutant("QR1", "sources/stores/errors.py", 'TRANSIENT_CURL_CODES = ("8",)', "TRANSIENT_CURL_CODES = ()",
           "a reply cut mid-way (curl 8) read as permanent"),
    Mutant("QR2", "sources/stores/writer.py", "        return retried_write(attempt, what)",
           "        return attempt()", "a write's block not retried"),
    Mutant("QR3", "sources/stores/writer.py", "open=tries > 1,", "open=False,",
           "a leaf created again after a lost answer refused as existing"),
    Mutant("QR4", "sources/stores/location.py", "    for variable in ENDPOINT_VARIABLES:",
           "    for variable in ENDPOINT_VARIABLES[1:]:", "AWS_ENDPOINT_URL_S3 ignored"),
    Mutant("QR5", "sources/stores/location.py", "probe = spec if resource in spec else {**spec, resource: REACH_RETRIES}",
           "probe = spec", "the first request gets TensorStore's minutes of retries"),
    Mutant("QR6", "sources/stores/location.py", 'return where if "endpoint" in where else {**where, "endpoint": endpoint}',
           "return where", "--endpoint ignored"),
    Mutant("QR9", "sources/stores/location.py", "    os.environ.setdefault(_name, _value)",
           "    pass", "no stall limit: a read whose connection stalls waits for good"),
    Mutant("QR7", "sources/documents/writer.py", "len(rows), len(rows), codecs,", "1 << 16, 1 << 16, codecs,",
           "a 1 MiB index chunk for any store"),
    # ------------------------------------------------------------- prepare/ (issue 35, store)
    Mutant("QS1", "prepare/tokenize.py", "encode_batch_fast(texts, add_special_tokens=False)",
           "encode_batch_fast(texts, add_special_tokens=True)",
           "the post-processor's special tokens added to every document"),
    Mutant("QS2", "prepare/__init__.py",
           "        if uncommitted:  # the parts finished before an error (or the last few) are kept",
           "        if False:", "the parts finished since the last commit lost on an error"),
    Mutant("QS3", "prepare/parts.py", "body, if_equal=self.generation)", "body)",
           "the manifest written without compare-and-swap"),
    Mutant("QS4", "prepare/chat.py", "dtype = id_dtype(len(tokenizer))",
           "dtype = id_dtype(tokenizer.vocab_size)",
           "chat ids in a dtype without the added tokens (template tokens above 255 cut)"),
    Mutant("QS5", "prepare/tasks.py", "key = (digest, task.bos, task.eos)",
           "key = (task.tokenizer, task.bos, task.eos)", "the tokenizer cached by its path"),
    Mutant("QS6", "prepare/tokenize.py", 'MORE_FILES = ("chat_template.jinja", ', "MORE_FILES = (",
           "chat_template.jinja not in the store's key"),
    # ------------------------------------------------ indexes beside a store (issue 36, index)
    Mutant("IX1", "sources/views/pack_index.py", "    if built_for != digest:",
           "    if False:", "a pack index of another store of the same size used"),
    Mutant("IX2", "sources/views/pack_index.py",
           "        if store.num_documents <= IN_MEMORY_DOCUMENTS:", "        if True:",
           "every host of a large store builds its missing pack index at start-up"),
    Mutant("IX3", "prepare/indexes.py",
           "            counts[part.part] = _read_part(folder, name, part)",
           "            pass", "a killed pack index build plans every part again"),
    Mutant("IX4", "prepare/indexes.py", '"nonempty": np.add.reduceat(lengths > 0,',
           '"nonempty": np.add.reduceat(lengths >= 0,',
           "a Levanter cache's document index counts its empty documents as non-empty"),
    Mutant("IX5", "prepare/indexes.py",
           'build = f"{_DOCUMENTS_BUILD}{documents}-{tokens}-{_cache_digest(written, at_edges)}/"',
           'build = f"{_DOCUMENTS_BUILD}{documents}-{tokens}/"',
           "a Levanter document index resumes from parts of another cache of the same size"),
    Mutant("QA1", "prepare/readers.py", "            if unit.byte_start <= block.offset and (",
           "            if True or (", "a task of a remote Arrow file reads every batch's body"),
    # ------------------------------------------------------------- prepare/ (issue 36, corpus size)
    Mutant("QT1", "prepare/readers.py", "        file.seek(start - 1)  # a newline just before",
           "        file.seek(start)  # a newline just before",
           "a line that starts at a range's first byte read by no range"),
    Mutant("QT2", "prepare/readers.py", "    count, left = 1, unit.byte_start - 1",
           "    count, left = 0, unit.byte_start - 1", "a later range's line numbers off by one"),
    Mutant("QT3", "prepare/parts.py", "            self._clean_remote_parts(named)", "            pass",
           "a killed remote part's objects never deleted"),
    Mutant("QT4", "prepare/parts.py",
           '        return json.dumps([identity["file"], identity["rows"], identity["bytes"]])',
           '        return json.dumps([identity["file"], identity["rows"]])',
           "two byte ranges of one file taken for one unit"),
    Mutant("QT5", "prepare/readers.py", "        elif version != self.version:", "        elif False:",
           "an object replaced while it is read mixes two versions"),
    Mutant("QT6", "prepare/tasks.py", "report(Progress(len(batch.values) + len(batch.bad),",
           "report(Progress(len(batch.values),", "malformed records left out of the progress"),
    # -------------------------------------------- the token path's reads (issue 36, latency)
    Mutant("LT1", "sources/documents/store.py",
           "futures = [array[a:b].read(batch=batch) for a, b in spans]",
           "futures = [array[a:b].read() for a, b in spans]",
           "a document store's range reads not batched (a shard index and a request per range)"),
    Mutant("LT2", "sources/documents/format.py", "CACHE_BYTES = 64 << 20", "CACHE_BYTES = 0",
           "no cache: every read of an object-store document store fetches its shard indexes"),
    Mutant("LT4", "sources/documents/mapped.py",
           "stride = p.per_chunk * item + 4 * p.checksum", "stride = p.per_chunk * item",
           "mapped chunks located without their checksum bytes"),
    Mutant("LT5", "_runtime/prefetch.py", "self.max_read_threads, 2 * self.read_threads,",
           "self.max_read_threads, 4 * self.read_threads,",
           "read threads grown more than twofold at once"),
    Mutant("LT6", "_runtime/prefetch.py", "if rate is not None and before is not None and rate < GAIN * before:",
           "if False:", "read threads grown on although the last growth did not help"),
    Mutant("LT7", "sources/documents/mapped.py",
           "            self._verify(number, numbers, maps, slot, in_shard)  # before any bytes are copied",
           "            pass", "a mapped range read returns a chunk's bytes unchecked"),
    Mutant("LT8", "sources/documents/mapped.py",
           "        self._verify(part, numbers, maps, slot, row)  # before any of the chunks' values are read",
           "",
           "a mapped probe (take) returns a chunk's bytes unchecked"),
    Mutant("LT9", "sources/documents/mapped.py", "fresh = np.flatnonzero(~maps[0].checked[k])",
           "fresh = np.arange(len(k))", "every read checks its chunks again (the record ignored)"),
    Mutant("LT15", "sources/documents/mapped.py", "flags[slot * per_shard + k]", "flags[k]",
           "a read over several shards looks up each chunk's check in the first shard's flags"),
    Mutant("LT16", "sources/documents/mapped.py",
           "mapped = Mapped(data, offsets.astype(np.int64), sizes, rows, np.zeros(chunks, bool))",
           "mapped = Mapped(data, offsets.astype(np.int64), sizes, rows, "
           "self.__dict__.setdefault('_kept', {}).setdefault(key, np.zeros(chunks, bool)))",
           "a shard mapped again keeps what was checked before it was let go"),
    Mutant("LT17", "sources/documents/mapped.py", "c * stride + maps[s].sizes[c]",
           "c * stride + stride", "a short last chunk checked over bytes past its checksum"),
    Mutant("LT11", "sources/views/mixture.py", "    if len(reads) < 2 or not storage:",
           "    if True:", "a mixture's sources that wait on storage read one after the other"),
    Mutant("LT12", "_runtime/prefetch.py",
           "counted = steps + 1 >= TIMED_READS or self._rate_before is None",
           "counted = steps + 1 >= TIMED_READS",
           "the first growth of the read threads waits for a window of steps (start-up waits)"),
    Mutant("LT13", "sources/documents/mapped.py", "bad = np.flatnonzero(np.array(got) != CHECKED)",
           "bad = np.flatnonzero(np.array(got) == -1)", "a chunk failing its crc32c is returned"),
    Mutant("LT14", "sources/documents/mapped.py", "            MAPS.admit(self, key)",
           "            pass", "every shard file stays mapped (past vm.max_map_count reads fail)"),
    Mutant("LT10", "sources/documents/mapped.py",
           "if p.index_checksum and _crc32c(table_bytes) != int(index[-4:].view(\"<u4\")[0]):",
           "if False:", "a damaged shard index used unchecked"),
    # ---------------------------------------- Grain, MaxText and Orbax (issue 37, items 2 and 3)
    Mutant("GM1", "sources/stores/grain.py", "self._copy = not reads_fresh_rows(source)",
           "self._copy = False", "Grain records share a buffer the source refills"),
    Mutant("GM2", "sources/stores/grain.py",
           "return [{k: v[i] for k, v in leaves.items()} for i in range(len(ids))]",
           "return [{k: v[i] for k, v in leaves.items()} for i in reversed(range(len(ids)))]",
           "Grain's batched read hook returns the records out of order"),
    Mutant("GM3", "sources/views/maxtext.py",
           '"targets_segmentation": np.where(rows["loss_mask"] != 0, segments, 0).astype(np.int32),',
           '"targets_segmentation": segments.copy(),',
           "MaxText's loss counts tokens without a real target"),
    Mutant("OX1", "orbax.py",
           "return args.restore(state) if isinstance(args, LoaderRestore) else state",
           "return state", "LoaderRestore gives the state, not a loader at its step"),
    # -------------------------------------------- what identifies a store (issue 36, identity)
    Mutant("ID1", "sources/documents/beside.py",
           "    if written is not None:  # none: the digest of a store written before it was recorded",
           "    if False:  # none: the digest of a store written before it was recorded",
           "a store's digest leaves out its write: a same-size store reordered keeps its stale index"),
    # ------------------------------------------ one loader over length stages (issue 38, item 1)
    Mutant("LS1", "_runtime/feeds.py", "ids[ids != PAD] -= self.stage_starts[stage]",
           "ids[ids != PAD] -= 0", "a later length stage reads its rows from its stage's row 0"),
    Mutant("LS2", "_runtime/feeds.py", "if before.offset + before.rows > start:", "if False:",
           "a step across a length stage's start is read with one stage's width"),
    Mutant("LS3", "_runtime/loader.py",
           "return loader_state(step, self.options.order, self.feed, self._record_plan)",
           "return loader_state(step, self.options.order, self.feed, self.plan)",
           "a state records the leaves of the stage it was saved in, not stage 0's"),
    Mutant("LS4", "_runtime/loader.py", "state, loader._record_plan, loader.feed.rows",
           "state, loader.plan, loader.feed.rows",
           "a restore inside a later length stage compares that stage's leaves with stage 0's"),
    Mutant("LS5", "_runtime/loader.py", "            if seq_len % devices:",
           "            if False:", "a length stage's seq_len split unevenly over the context axis"),
    # ------------------------------------------------ packed length stages (issue 38, item 1)
    Mutant("PS1", "_plan/packed_stages.py",
           "token = int(chunk.plan.piece_start[piece]) + (cursor.token if doc == 0 else 0)",
           "token = int(chunk.plan.piece_start[piece])",
           "a stage that starts inside a split document goes on from its token 0 again"),
    Mutant("PS2", "_plan/packed_stages.py",
           "start = self._cursor_at(source, lane, stage - 1, int(before))",
           "start = self._cursor_at(source, lane, stage - 1, max(0, int(before) - 1))",
           "a lane's cursor at a stage's start leaves out the stage before's last row"),
    Mutant("PS4", "_plan/packed_stages.py",
           "token = int(plan.piece_start[piece]) + (at.token if doc == 0 else 0)",
           "token = int(plan.piece_start[piece])",
           "a chunk that starts inside a split document ends at a cursor from its token 0"),
    Mutant("PS5", "_plan/packed_stages.py", "plan, order, len(plan) - 1, Cursor",
           "plan, order, len(plan), Cursor", "a chunk's open last row is taken as final"),
    Mutant("PS6", "_plan/packed_stages.py",
           'if saved.get("digest") != self._digest({"offset": offset, "at": saved["at"]}):',
           'if False:', "a state's packing cursors are used unchecked"),
    Mutant("PS3", "sources/views/packed.py",
           "self._column[piece], within + 1, eos)", "self._column[piece], within + 2, eos)",
           "a staged packed row numbers its segments from 2"),
    # ------------------------------- exact column reads at long context (issue 38, item 3)
    Mutant("LC1", "sources/views/staged.py", "parts.new[keep] & (shift == 0)", "parts.new[keep]",
           "a document cut at a window's first column starts a segment there"),
    Mutant("LC2", "sources/views/staged.py", "new = (doc_start >= lo[span]) | (opens & jump[at][span])",
           "new = doc_start >= lo[span]", "a row that goes on at another place keeps its segment"),
]  # fmt: skip

#: Single-process tests run against every mutant (the planner, reads, assembly and order).
TESTS = [
    "tests/test_tokens.py",
    "tests/test_prepare.py",
    "tests/test_chat.py",
    "tests/test_prepare_readers.py",
    "tests/test_prepare_split.py",
    "tests/test_documents.py",
    "tests/test_packing.py",
    "tests/test_mixture.py",
    "tests/test_mixture_loader.py",
    "tests/test_oracle.py",
    "tests/test_order.py",
    "tests/test_offsets.py",
    "tests/test_schedule.py",
    "tests/test_mesh.py",
    "tests/test_hosts.py",
    "tests/test_partition.py",
    "tests/test_loader.py",
    "tests/test_filter_shard.py",
    "tests/test_streams.py",
    "tests/test_bad_input.py",
    "tests/test_cli.py",
    "tests/test_consistency.py",
    "tests/test_simulate.py",
    "tests/test_prefetch.py",
    "tests/test_telemetry.py",
    "tests/test_state.py",
    "tests/test_sources.py",
    "tests/test_faults.py",
    "tests/test_fake_hosts.py",
    "tests/test_loader_inputs.py",
    "tests/test_config.py",
    "tests/test_data_config.py",
    "tests/test_staged_tokens.py",
    "tests/test_length_config.py",
    "tests/test_packed_stages.py",
    "tests/test_staged_packed.py",
    "tests/test_packed_length_config.py",
    "tests/test_packed_cursors.py",
    "tests/test_store_indexes.py",
    "tests/test_spatial.py",
    "tests/test_spatial_oracle.py",
    "tests/test_reads.py",
    "tests/test_object_store_retries.py",
    "tests/test_review36.py",
    "tests/test_eval.py",
    "tests/test_object_tokens.py",
    "tests/test_mapped.py",
    "tests/test_grain_maxtext.py",
    "tests/test_orbax.py",
    "src/psdp/_plan/order.py",
    "src/psdp/_plan/mesh.py",
    "src/psdp/_plan/layout.py",
    "src/psdp/_plan/partition.py",
    "src/psdp/_plan/reads.py",
    "src/psdp/_plan/windows.py",
    "src/psdp/_runtime/assembly.py",
]
#: Multi-process tests, for mutants that survive the single-process ones.
POD_TESTS = [
    "tests/test_pod_matrix.py",
    "tests/test_loader_multiprocess.py",
    "tests/test_spatial_pod.py",
    "tests/test_eval_pod.py",
    "tests/test_orbax_pod.py",
    "tests/test_length_pod.py",
]


def copy_repository(to: Path) -> None:
    ignore = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".hypothesis", "*.egg-info")
    for name in ("src", "tests", "docs", "scripts"):
        shutil.copytree(ROOT / name, to / name, ignore=ignore)
    for name in ("conftest.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, to / name)


def run_tests(copy: Path, tests: list[str], marker: str | None) -> tuple[bool, str]:
    """(whether a test failed, the first failing test) for the copy as it is now."""
    command = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider"]
    command += ["--hypothesis-profile=mutation"]  # conftest.py: no shrinking
    if marker:
        command += ["-m", marker]
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
    except subprocess.TimeoutExpired:
        return True, "timed out (900 s)"
    if done.returncode == 0:
        return False, ""
    if done.returncode == 5:
        raise SystemExit(f"no test ran: {' '.join(command)}")
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", done.stdout, re.M)
    return True, failed[0] if failed else f"exit {done.returncode}: {done.stdout[-300:]}"


def run_mutant(
    copy: Path, mutant: Mutant, tests: list[str], marker: str | None
) -> tuple[bool, str]:
    path = copy / "src" / "psdp" / mutant.file
    original = path.read_text()
    path.write_text(original.replace(mutant.old, mutant.new))
    try:
        return run_tests(copy, tests, marker)
    finally:
        path.write_text(original)


def check_mutants(mutants: list[Mutant]) -> None:
    """Every mutant's text occurs exactly once, so each one really changes the code."""
    names = [m.name for m in mutants]
    assert len(set(names)) == len(names), "mutant names must be unique"
    for m in mutants:
        count = (ROOT / "src" / "psdp" / m.file).read_text().count(m.old)
        if count != 1:
            raise SystemExit(f"mutant {m.name}: its text occurs {count} times in {m.file}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="mutant names to run (default: all)")
    parser.add_argument("--tests", nargs="*", help="test paths (default: the module's TESTS)")
    parser.add_argument("--skip", nargs="*", default=[], help="test paths to leave out of TESTS")
    parser.add_argument("--no-pods", action="store_true", help="skip the multi-process re-run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    check_mutants(mutants)
    if args.list:
        for m in mutants:
            print(f"{m.name:4} {m.file:28} {m.what}")
        return 0
    tests = args.tests or [t for t in TESTS if t not in args.skip]
    marker = None if args.tests else "not multiprocess"  # tests named by hand run as they are
    survivors = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="psdp-mutation-") as name:
        copy = Path(name)
        copy_repository(copy)
        failed, first = run_tests(copy, tests, marker)
        if failed:
            raise SystemExit(f"the tests fail without any mutant: {first}")
        for m in mutants:
            killed, by = run_mutant(copy, m, tests, marker)
            print(f"{m.name:4} {'killed' if killed else 'SURVIVED':8} {m.what}  [{by}]", flush=True)
            if not killed:
                survivors.append(m)
        if survivors and not args.no_pods:
            print(f"re-running {len(survivors)} survivors with the multi-process tests", flush=True)
            for m in list(survivors):
                killed, by = run_mutant(copy, m, POD_TESTS, None)
                print(
                    f"{m.name:4} {'killed' if killed else 'SURVIVED':8} (pods)  [{by}]", flush=True
                )
                if killed:
                    survivors.remove(m)
    killed = len(mutants) - len(survivors)
    print(
        f"\n{killed}/{len(mutants)} mutants killed ({100 * killed / len(mutants):.0f}%) in "
        f"{time.monotonic() - started:.0f} s; survivors: {[m.name for m in survivors] or 'none'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
