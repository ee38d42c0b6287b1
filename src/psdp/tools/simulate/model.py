"""The tiny model ``psdp simulate --train`` fits on every host: a bigram language model, sharded
over the model axes, its batch sharded as the loader planned (``docs/reference/cli.md``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from psdp.tools.simulate.config import Simulation
from psdp.tools.simulate.data import main_leaf


class TinyModel:
    """A bigram language model (embedding + linear head) trained with plain SGD, all jitted.

    The hidden dimension is sharded over the mesh's non-batch axes (tensor parallelism: the head's
    contraction all-reduces across hosts on a non-contiguous mesh).
    """

    def __init__(self, mesh: Any, sim: Simulation) -> None:
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        batch_axes = sim.mesh.resolved_batch_axes()
        model_axes = tuple(a for a in mesh.axis_names if a not in batch_axes)
        width = 8 * max(1, math.prod(mesh.shape[a] for a in model_axes))
        hidden = None if not model_axes else model_axes[0] if len(model_axes) == 1 else model_axes
        self.summary = (
            f"bigram model, embedding {sim.vocab}x{width} + head, hidden dimension sharded over "
            f"{hidden or 'nothing'}, jitted SGD step, batch sharded over {batch_axes}"
        )

        class Bigram(eqx.Module):
            embed: jax.Array
            head: jax.Array

            def __call__(self, tokens: jax.Array) -> jax.Array:
                return self.embed[tokens] @ self.head

        def init() -> Bigram:
            k1, k2 = jax.random.split(jax.random.key(0))
            return Bigram(
                jax.random.normal(k1, (sim.vocab, width)) * 0.1,
                jax.random.normal(k2, (width, sim.vocab)) * 0.1,
            )

        # a pytree shaped like the model whose leaves are shardings
        shardings = Bigram(
            NamedSharding(mesh, P(None, hidden)),  # type: ignore[arg-type]
            NamedSharding(mesh, P(hidden)),  # type: ignore[arg-type]
        )
        self.params = jax.jit(init, out_shardings=shardings)()
        lr = sim.learning_rate

        def loss_fn(model: Bigram, tokens: jax.Array, weight: jax.Array) -> jax.Array:
            logits = model(tokens[:, :-1])
            logp = jax.nn.log_softmax(logits, axis=-1)
            target = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
            return -(target * weight).sum() / jnp.maximum(weight.sum(), 1)

        def step(model: Bigram, tokens: jax.Array, weight: jax.Array) -> tuple[Bigram, jax.Array]:
            loss, grads = jax.value_and_grad(loss_fn)(model, tokens, weight)
            return jax.tree.map(lambda p, g: p - lr * g, model, grads), loss

        def plain(model: Bigram, tokens: jax.Array) -> tuple[Bigram, jax.Array]:
            return step(model, tokens, jnp.ones(tokens[:, 1:].shape))

        def packed(
            model: Bigram, tokens: jax.Array, segments: jax.Array, loss_mask: jax.Array | None
        ) -> tuple[Bigram, jax.Array]:
            # predict a token only from the one before it in the same document
            same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
            return step(model, tokens, same if loss_mask is None else same * loss_mask[:, 1:])

        self._plain = jax.jit(plain, donate_argnums=0)
        self._packed = jax.jit(packed, donate_argnums=0)
        self.mask_key = sim.data.output.mask_key or "mask"

    def step(self, batch: Any) -> float:
        """One SGD step on the batch's main leaf (documents: within each document, on its loss
        mask if the batch has one); returns the loss."""
        if isinstance(batch, dict) and "segment_ids" in batch:
            tokens = batch["input_ids"]
            args = (tokens, batch["segment_ids"], batch.get("loss_mask"))
            self.params, loss = self._packed(self.params, *args)
        else:
            tokens = main_leaf(batch, self.mask_key)[1] if isinstance(batch, dict) else batch
            self.params, loss = self._plain(self.params, tokens)
        return float(np.asarray(loss.addressable_data(0)))
