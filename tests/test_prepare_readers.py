"""`psdp.prepare.readers` and `tokenize`: every input kind gives back exactly the texts the test
wrote (in order), a malformed record is an error naming its file and line/row, or with skip_bad
is counted with its reason; the tokenizer step equals the tokenizer called directly."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from psdp.prepare.readers import BadRecordError, CorruptFileError, plan_units, read_batches
from psdp.prepare.tokenize import Encoder, id_dtype, load_tokenizer
from tests import prepare_corpus as corpus


def read_all(units, field="text", skip_bad=False):
    values, bad = [], []
    for unit in units:
        for batch in read_batches(unit, field, str, skip_bad):
            values += batch.values
            bad += batch.bad
    return values, bad


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.jsonl.zst", "a.parquet", "a.arrow"])
def test_each_file_kind_reads_back_its_texts_in_order(tmp_path, name):
    texts = corpus.texts(100, seed=1)
    path = tmp_path / name
    if name.endswith(".parquet"):
        corpus.write_parquet(path, texts)
    elif name.endswith(".arrow"):
        corpus.write_arrow(path, texts)
    else:
        corpus.write_jsonl(path, texts)
    units = plan_units([str(path)], rows_per_part=40)
    assert read_all(units) == (texts, [])
    if name.endswith((".parquet", ".arrow")):  # cut at row groups of 16: 48, 48, 4 rows
        assert [(u.row_start, u.row_stop) for u in units] == [(0, 48), (48, 96), (96, 100)]


def test_a_datasets_export_and_a_glob_read_in_order(tmp_path):
    texts = corpus.texts(50, seed=2)
    corpus.write_datasets_export(tmp_path / "export", texts[:30], shards=3)
    for i, chunk in enumerate((texts[30:40], texts[40:])):
        corpus.write_jsonl(tmp_path / f"shard-{i}.jsonl", chunk)
    units = plan_units([str(tmp_path / "export"), str(tmp_path / "shard-*.jsonl")], 1000)
    assert len(units) == 5
    assert read_all(units) == (texts, [])


def test_an_s3_glob_reads_like_local_files(tmp_path):
    from psdp.tools.benchmarks.object_store import S3Server

    texts = corpus.texts(40, seed=3)
    with S3Server() as server:
        store = server.objects()
        for i, chunk in enumerate((texts[:25], texts[25:])):
            local = corpus.write_jsonl(tmp_path / f"s{i}.jsonl.gz", chunk)
            store.write(f"in/s{i}.jsonl.gz", local.read_bytes()).result()
        corpus.write_parquet(tmp_path / "p.parquet", texts)
        store.write("in/p.parquet", (tmp_path / "p.parquet").read_bytes()).result()
        jsonl = plan_units([server.kvstore("in/s*.jsonl.gz")], 1000)
        parquet = plan_units([server.kvstore("in/p.parquet")], 1000)
        assert [u.name.split(" ")[0] for u in jsonl] == ["s3://psdp/in/s0.jsonl.gz",
                                                         "s3://psdp/in/s1.jsonl.gz"]  # fmt: skip
        assert read_all(jsonl) == (texts, [])
        assert read_all(parquet) == (texts, [])


MALFORMED = (
    '{"text": "fine"}\n'
    '{"text": "cut off\n'  # line 2: broken JSON
    "\n"  # a blank line: no record
    '["a list"]\n'  # line 4
    '{"body": "x"}\n'  # line 5: no text field
    '{"text": 7}\n'  # line 6: not a string
    '{"text": "also fine"}\n'
)


def test_a_malformed_record_names_its_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(gzip.compress(MALFORMED.encode()))
    with pytest.raises(BadRecordError, match=r"bad.jsonl.gz, line 2: not valid JSON .*skip_bad"):
        read_all(plan_units([str(path)], 10))


def test_skip_bad_counts_each_record_with_its_reason(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(MALFORMED)
    values, bad = read_all(plan_units([str(path)], 10), skip_bad=True)
    assert values == ["fine", "also fine"]
    assert [(where.rsplit(", ", 1)[1], reason.split(" (")[0]) for where, reason in bad] == [
        ("line 2", "not valid JSON"),
        ("line 4", "a JSON list, not an object"),
        ("line 5", "no field 'text'"),
        ("line 6", "field 'text' is int, not a str"),
    ]


def test_a_null_in_a_parquet_column_names_its_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), tmp_path / "n.parquet")
    with pytest.raises(BadRecordError, match=r"n.parquet, row 2: field 'text' is null"):
        read_all(plan_units([str(tmp_path / "n.parquet")], 10))


def test_encoder_equals_the_tokenizer_called_directly_and_decodes_back(tmp_path):
    texts = [*corpus.texts(64, seed=4), ""]
    tokenizer = load_tokenizer(corpus.train_tokenizer(tmp_path / "tok" / "tokenizer.json"))
    encoder = Encoder(tokenizer, bos="<|bos|>", eos=1)
    got = encoder.encode(texts)
    assert got[-1] is None  # an empty text is no document
    for text, ids in zip(texts[:-1], got[:-1], strict=True):
        direct = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids.dtype == np.uint16  # 300 ids
        assert ids.tolist() == [0, *direct, 1]
        assert tokenizer.decode(ids[1:-1].tolist()) == text


def test_id_dtype_is_the_smallest_that_holds_the_vocabulary():
    assert [id_dtype(n) for n in (2, 256, 257, 65_536, 65_537, 2**32 + 1)] == [
        np.uint8, np.uint8, np.uint16, np.uint16, np.uint32, np.uint64,
    ]  # fmt: skip


# ------------------------------------------------------------------ files that end or break early
def compressed(name, body):
    import zstandard

    return gzip.compress(body) if name.endswith(".gz") else zstandard.compress(body)


def partial_lines(name, cut):
    """How many whole lines the decompressible prefix ``cut`` of a compressed file holds: the
    standard streaming decoders' own output (the oracle)."""
    import zlib

    import zstandard

    if name.endswith(".gz"):
        out = zlib.decompressobj(wbits=31).decompress(cut)
    else:
        out = zstandard.ZstdDecompressor().decompressobj().decompress(cut)
    return out.count(b"\n")


@pytest.mark.parametrize("skip_bad", [False, True])
@pytest.mark.parametrize("name", ["a.jsonl.gz", "a.jsonl.zst"])
def test_a_truncated_compressed_file_is_an_error_naming_the_file_byte_and_line(
    tmp_path, name, skip_bad
):
    texts = corpus.texts(5000, seed=5)  # ~500 kB: zstd blocks of 128 kB, some read whole
    whole = corpus.write_jsonl(tmp_path / name, texts).read_bytes()
    cut = whole[: len(whole) * 3 // 5]
    (tmp_path / name).write_bytes(cut)
    line = partial_lines(name, cut) + 1
    assert 1000 < line < 5000
    kind = "gzip" if name.endswith(".gz") else "zstd"
    with pytest.raises(CorruptFileError) as error:
        read_all(plan_units([str(tmp_path / name)], 10), skip_bad=skip_bad)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / name}: the {kind} data is cut short"), message
    assert f"(at byte {len(cut):,})" in message and f"in line {line:,} " in message, message


@pytest.mark.parametrize("name", ["a.jsonl.gz", "a.jsonl.zst"])
def test_damaged_compressed_data_is_an_error_naming_the_file_and_bytes(tmp_path, name):
    body = "".join(json.dumps({"text": t}) + "\n" for t in corpus.texts(300, seed=6)).encode()
    damaged = bytearray(compressed(name, body))
    middle = len(damaged) // 2
    damaged[middle : middle + 16] = bytes(16)
    (tmp_path / name).write_bytes(damaged)
    with pytest.raises(CorruptFileError, match=rf"{name}: the \w+ data is damaged within bytes"):
        read_all(plan_units([str(tmp_path / name)], 10), skip_bad=True)


@pytest.mark.parametrize("name", ["a.jsonl.gz", "a.jsonl.zst"])
def test_concatenated_members_and_padding_read_whole(tmp_path, name):
    # `cat a.gz b.gz` and pzstd write several members (frames); gzip allows zero padding after one
    texts = corpus.texts(200, seed=7)
    bodies = ["".join(json.dumps({"text": t}) + "\n" for t in part).encode()
              for part in (texts[:1], texts[1:120], texts[120:])]  # fmt: skip
    data = b"".join(compressed(name, body) for body in bodies)
    if name.endswith(".gz"):
        data += bytes(100)
    (tmp_path / name).write_bytes(data)
    assert read_all(plan_units([str(tmp_path / name)], 10)) == (texts, [])


def test_a_damaged_row_group_names_the_file_and_the_first_row_not_read(tmp_path):
    import pyarrow.parquet as pq

    path = corpus.write_parquet(tmp_path / "a.parquet", corpus.texts(1500, seed=8), 500)
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)  # rows 500-999
    data = bytearray(path.read_bytes())
    first = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    start = first + column.total_compressed_size // 2  # the middle of rows 500-999's bytes
    data[start : start + 64] = bytes(64)
    path.write_bytes(data)
    units = plan_units([str(path)], rows_per_part=500)
    assert read_all(units[:1])[0] == corpus.texts(1500, seed=8)[:500]
    with pytest.raises(CorruptFileError, match=r"a.parquet: cannot read on from row 500 \("):
        read_all(units[1:], skip_bad=True)


@pytest.mark.parametrize("name", ["A.JSONL", "b.ndjson", "c.NDJSON.GZ", "d.Jsonl.Zst", "e.PARQUET"])
def test_ndjson_and_endings_in_any_case_are_read(tmp_path, name):
    texts = corpus.texts(30, seed=9)
    if name.lower().endswith(".parquet"):
        corpus.write_parquet(tmp_path / name, texts)
    else:  # corpus.write_jsonl compresses by the lower-case ending
        data = corpus.write_jsonl(tmp_path / name.lower(), texts).read_bytes()
        (tmp_path / name.lower()).unlink()
        (tmp_path / name).write_bytes(data)
    assert read_all(plan_units([str(tmp_path / name)], 1000)) == (texts, [])


def test_a_byte_order_mark_opens_a_jsonl_file_and_is_no_record(tmp_path):
    lines = [json.dumps({"text": t}) for t in ("the fox", "lazy dog")]
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    assert read_all(plan_units([str(tmp_path / "a.jsonl")], 10)) == (["the fox", "lazy dog"], [])
    # within the file it is no JSON: a malformed record, as any stray byte
    (tmp_path / "b.jsonl").write_bytes(lines[0].encode() + b"\n\xef\xbb\xbf" + lines[1].encode())
    values, bad = read_all(plan_units([str(tmp_path / "b.jsonl")], 10), skip_bad=True)
    assert values == ["the fox"] and [w.rsplit(", ", 1)[1] for w, _ in bad] == ["line 2"]


def test_a_json_error_reads_as_one_phrase(tmp_path):
    """json's own message ends in "at" ("Invalid control character at"): said once."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"text": "a\tb"}\n')  # a raw tab inside a JSON string
    with pytest.raises(BadRecordError) as info:
        read_all(plan_units([str(path)], 10))
    assert "(Invalid control character at column 12)" in str(info.value), str(info.value)
