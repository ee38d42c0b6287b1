"""A tiny decoder-only transformer in Equinox, for packed rows.

Documents packed into one row must not see each other: a token attends to the tokens before it
(causality) that carry its segment id (`segment_ids`, 0 on padding); its position embedding is
read at `positions`, which restart at 0 in every segment. The loss is the mean next-token cross
entropy over the tokens whose target is real (`targets` and `loss_mask`, from
`PackedSequences(targets=True)`).
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


@dataclass(frozen=True)
class ModelConfig:
    """The model and its optimizer."""

    vocab_size: int = 512
    """Token ids the embedding holds (the tokenizer's vocabulary)."""
    d_model: int = 64
    """Width of the residual stream."""
    heads: int = 4
    """Attention heads (d_model must be a multiple)."""
    layers: int = 2
    """Transformer blocks."""
    learning_rate: float = 3e-3
    """Adam's learning rate."""
    seed: int = 0
    """The parameters' initialisation."""


class Block(eqx.Module):
    """Pre-norm attention and MLP."""

    qkv: jax.Array
    out: jax.Array
    up: jax.Array
    down: jax.Array
    norm_attention: jax.Array
    norm_mlp: jax.Array
    heads: int = eqx.field(static=True)

    def __init__(self, d: int, heads: int, key: jax.Array):
        keys = jax.random.split(key, 4)
        self.qkv = jax.random.normal(keys[0], (d, 3 * d)) / d**0.5
        self.out = jax.random.normal(keys[1], (d, d)) / d**0.5
        self.up = jax.random.normal(keys[2], (d, 4 * d)) / d**0.5
        self.down = jax.random.normal(keys[3], (4 * d, d)) / (4 * d) ** 0.5
        self.norm_attention = jnp.ones(d)
        self.norm_mlp = jnp.ones(d)
        self.heads = heads

    def __call__(self, x: jax.Array, allowed: jax.Array) -> jax.Array:
        batch, length, d = x.shape
        q, k, v = jnp.split(rms_norm(x, self.norm_attention) @ self.qkv, 3, axis=-1)
        q, k, v = (t.reshape(batch, length, self.heads, d // self.heads) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // self.heads) ** 0.5
        # a finite fill, not -inf: a padding token allows nothing, and its softmax stays finite
        scores = jnp.where(allowed[:, None], scores, -1e9)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        x = x + mixed.reshape(batch, length, d) @ self.out
        return x + jax.nn.gelu(rms_norm(x, self.norm_mlp) @ self.up) @ self.down


class Transformer(eqx.Module):
    """Token and position embeddings, blocks, and a head tied to the token embedding."""

    embed: jax.Array
    position: jax.Array
    blocks: tuple[Block, ...]
    norm: jax.Array

    def __init__(self, config: ModelConfig, seq_len: int):
        keys = jax.random.split(jax.random.key(config.seed), config.layers + 2)
        d = config.d_model
        self.embed = jax.random.normal(keys[0], (config.vocab_size, d)) * 0.02
        self.position = jax.random.normal(keys[1], (seq_len, d)) * 0.02
        self.blocks = tuple(Block(d, config.heads, k) for k in keys[2:])
        self.norm = jnp.ones(d)

    def __call__(self, input_ids, segment_ids, positions):
        """Logits ``(batch, seq_len, vocab)`` of a batch of packed rows."""
        length = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((length, length), bool))
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        allowed = causal & same & (segment_ids != 0)[:, :, None]
        x = self.embed[input_ids] + self.position[positions]
        for block in self.blocks:
            x = block(x, allowed)
        return rms_norm(x, self.norm) @ self.embed.T


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def row_loss_sums(model: Transformer, batch) -> tuple[jax.Array, jax.Array]:
    """Per row, the summed next-token cross entropy and the number of tokens it covers."""
    logits = model(batch["input_ids"], batch["segment_ids"], batch["positions"])
    # the packed targets: each token's next token in its segment, loss_mask 1 where it is real;
    # mask is False on the rows that pad a batch (an eval set's last one)
    weights = batch["loss_mask"].astype(jnp.float32) * batch["mask"][:, None]
    targets = batch["targets"].astype(jnp.int32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(losses * weights, axis=1), jnp.sum(weights, axis=1)


def loss_sum(model: Transformer, batch) -> tuple[jax.Array, jax.Array]:
    """The summed next-token cross entropy and the number of tokens it covers."""
    totals, tokens = row_loss_sums(model, batch)
    return jnp.sum(totals), jnp.sum(tokens)
