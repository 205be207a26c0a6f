"""PagedQwen3NextRunner: Qwen3-Next (model_type qwen3_next: Qwen3-Next-80B-A3B) and Qwen3.5's text decoders
(qwen3_5_text, qwen3_5_moe_text: what AutoModelForCausalLM loads from a Qwen3.5 checkpoint), hybrid decoders --
three Gated DeltaNet layers (linear attention with a recurrent state) to each gated attention layer --
with speculative decoding's rollback of the recurrent states.

The Gated DeltaNet layers' states (the convolution's last K - 1 inputs [C, K - 1] and the delta rule's
matrix [Hv, Dk, Dv], float32), their snapshot per draft token and their rollback at commit are
runners/paged_recurrent.py's (PagedRecurrentRunner); the attention layers use the paged cache.

The math is transformers 5.24's Qwen3NextDecoderLayer (modeling_qwen3_next.py), eval mode:
    norms              Qwen3NextRMSNorm: x * rsqrt(mean x^2 + eps) * (1 + w) in float32
    attention layer    q_proj -> per head [q | gate]; q_norm / k_norm per head; RoPE on the first
                       partial_rotary_factor of each head; paged attention; out * sigmoid(gate); o_proj
    Gated DeltaNet     in_proj_qkvz / in_proj_ba -> q, k, v, z, b, a (grouped by key head); a causal
                       depthwise convolution of [q | k | v] over the row (kernel K), SiLU; q, k L2-normed,
                       q / sqrt(Dk); beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); per token,
                       in float32: S = S exp(g); S += k (beta (v - S^T k))^T; o = S^T q; then
                       RMSNormGated(o, z) (norm, weight, times silu(z)); out_proj
    MLP                a sparse MoE (runners/_moe.py: Qwen2-MoE's routing with a gated shared expert)
                       or a dense SwiGLU
Left padding: transformers zeroes a padded position's input to a recurrent layer (its state stays
zero until the row's first token); here padded positions do not touch the states at all, the same
thing for a state that starts at zero.

A prefill runs the delta rule in chunks of PREFILL_CHUNK tokens (_prefill_chunks, runners/chunked_prefill.py: within a
chunk the updates solve as one unit lower-triangular system, the state carried across chunks -- the WY form of
FLA's and transformers' chunked kernels; the convolution over each row at once); a score call runs its
n tokens at once from each row's state (_score_block: one n x n solve per head, every snapshot from one
einsum; _steps, transformers' recurrent rule token by token, is its reference); on the Triton path a score
call's delta rule is one launch (_score_fused: kernels/recurrent, the state tile in registers, every snapshot
stored from it), and a prefill's carry across its chunks is one launch too (kernels/chunk_scan) (neither timed on a
GPU; CPU: bench/bench_delta_rule.py). Token trees:
each node continues its parent's states (runners/paged_recurrent.py; through _score_fused on every backend). Tensor
parallelism: runners/paged_qwen3_next_tp.py (each rank its heads' states).
"""
import torch
import torch.nn.functional as F

from ._layer_math import linear_params, rope_cos_sin
from ._linear import linear
from ._moe import SHARED, is_moe, moe_or_gated_mlp, moe_or_mlp, moe_reason
from ._rotary import static_rope_reason
from ..kernels.llama_ops.reference import rotate_half_apply
from .paged_base import decoder_reason, head_dim_reason
from .chunked_prefill import scalar_decay_prefill
from .paged_recurrent import PagedRecurrentRunner, layer_kinds_reason, prefill_conv

# Qwen3-Next, and Qwen3.5's text decoders (AutoModelForCausalLM on a Qwen3.5 checkpoint: Qwen3_5ForCausalLM /
# Qwen3_5MoeForCausalLM): the same layers, the Gated DeltaNet's projections apart (in_proj_qkv / z / b / a), and
# text positions for its multimodal RoPE (the three position rows equal: plain RoPE)
QWEN3_NEXT_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
PREFILL_CHUNK = 64  # tokens a chunk of the prefill's delta rule (transformers' and FLA's default)
LAYER_KINDS = ("full_attention", "linear_attention")


def _projections(layer) -> tuple:
    """A Qwen3-Next layer's projection modules (for plain_projections_reason; block_type: transformers' layer kind)."""
    if layer.block_type == "linear_attention":
        mixer = layer.linear_attn
        mixing = ((mixer.in_proj_qkvz, mixer.in_proj_ba) if hasattr(mixer, "in_proj_qkvz") else
                  (mixer.in_proj_qkv, mixer.in_proj_z, mixer.in_proj_b, mixer.in_proj_a)) + (mixer.out_proj,)
    else:
        attn = layer.self_attn
        mixing = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    mlp = layer.mlp
    if is_moe(mlp):
        shared = next((getattr(mlp, name) for name in SHARED if getattr(mlp, name, None) is not None), None)
        dense = () if shared is None else (shared.gate_proj, shared.up_proj, shared.down_proj)
        gate = getattr(mlp, "shared_expert_gate", None)
        return mixing + dense + (() if gate is None else (gate,))
    return mixing + (mlp.gate_proj, mlp.up_proj, mlp.down_proj)


def qwen3_next_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedQwen3NextRunner cannot run ``model``, or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, LAYER_KINDS) or decoder_reason(model, QWEN3_NEXT_TYPES, "model.layers",
                                                                       "a Qwen3NextForCausalLM", _projections)
    if reason is not None:
        return reason
    for i, layer in enumerate(model.model.layers):
        reason = moe_reason(layer.mlp, config) if is_moe(layer.mlp) else None
        if reason is not None:
            return f"layer {i}: {reason}"
        if layer.block_type == "linear_attention" and layer.linear_attn.activation != "silu":
            return f"layer {i}: a Gated DeltaNet convolution with activation {layer.linear_attn.activation!r}"
    return static_rope_reason(getattr(model.model.rotary_emb, "rope_type", None)) or head_dim_reason(config.head_dim,
                                                                                                   backend)


def qwen_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Qwen3NextRMSNorm over the last dim: x * rsqrt(mean x^2 + eps) * (1 + w), in float32, then x's dtype.
    norm: (weight, eps)."""
    weight, eps = norm
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).type_as(x)


def gated_norm(x: torch.Tensor, z: torch.Tensor, norm) -> torch.Tensor:
    """Qwen3NextRMSNormGated: weight * norm(x) (cast back first), times silu(z) in float32; x's dtype."""
    weight, eps = norm
    x32 = x.float()
    normed = weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (normed * F.silu(z.float())).to(x.dtype)


class _Attention:
    """A gated attention layer's tensors: (weight, bias) of q (each head's [q | gate] rows), k, v, o; (weight,
    eps) of the per-head q / k norms."""

    def __init__(self, q, k, v, o, q_norm, k_norm):
        self.q, self.k, self.v, self.o, self.q_norm, self.k_norm = q, k, v, o, q_norm, k_norm

    @classmethod
    def of(cls, attn) -> "_Attention":
        """The module's own tensors (references)."""
        return cls(*linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj),
                   (attn.q_norm.weight, attn.q_norm.eps), (attn.k_norm.weight, attn.k_norm.eps))


class _DeltaNet:
    """A Gated DeltaNet layer's tensors and sizes: projections ((weight, bias) of Qwen3-Next's qkvz, ba --
    grouped -- or Qwen3.5's qkv, z, b, a), the convolution [C, K] and its bias, A_log / dt_bias [Hv], the
    gated norm (weight, eps), out (weight, bias); nk / nv key / value heads of dk / dv (this rank's under
    tensor parallelism)."""

    def __init__(self, projections, grouped: bool, conv, conv_bias, a_log, dt_bias, norm, out, nk, nv, dk, dv,
                 beta_scale: float = 1.0):
        self.projections, self.grouped, self.out, self.norm = projections, grouped, out, norm
        self.beta_scale = beta_scale  # OLMo Hybrid's allow_neg_eigval: beta = 2 sigmoid(b) (paged_olmo_hybrid.py)
        self.conv, self.conv_bias, self.a_log, self.dt_bias = conv, conv_bias, a_log, dt_bias
        self.nk, self.nv, self.dk, self.dv = nk, nv, dk, dv
        self.channels, self.kernel = conv.shape

    @property
    def shapes(self) -> tuple:
        """(conv state (C, K - 1), delta-rule state (Hv, Dk, Dv)): PagedRecurrentRunner's recurrent_shapes entry."""
        return (self.channels, self.kernel - 1), (self.nv, self.dk, self.dv)

    @classmethod
    def of(cls, mixer) -> "_DeltaNet":
        """The module's own tensors (references; the convolution a view [C, K])."""
        grouped = hasattr(mixer, "in_proj_qkvz")  # Qwen3-Next's; Qwen3.5's projections are apart
        projections = linear_params(*((mixer.in_proj_qkvz, mixer.in_proj_ba) if grouped else
                                      (mixer.in_proj_qkv, mixer.in_proj_z, mixer.in_proj_b, mixer.in_proj_a)))
        (out,) = linear_params(mixer.out_proj)
        return cls(projections, grouped, mixer.conv1d.weight[:, 0], mixer.conv1d.bias, mixer.A_log, mixer.dt_bias,
                   (mixer.norm.weight, mixer.norm.variance_epsilon), out, mixer.num_k_heads, mixer.num_v_heads,
                   mixer.head_k_dim, mixer.head_v_dim)

    def project(self, h: torch.Tensor):
        """h [T, H] -> [q | k | v] [T, C], z [T, nv, dv], b, a [T, nv]: Qwen3.5's four products (OLMo Hybrid's six:
        q, k and v apart, concatenated), or Qwen3-Next's two grouped by key head (split)."""
        if self.grouped:
            return self.split(*(linear(h, *p) for p in self.projections))
        outs = [linear(h, *p) for p in self.projections]
        if len(outs) == 6:  # OLMo Hybrid: q, k, v, then its gate (z), b, a
            outs = [torch.cat(outs[:3], dim=-1)] + outs[3:]
        qkv, z, b, a = outs
        return qkv, z.view(h.shape[0], self.nv, self.dv), b, a

    def split(self, qkvz: torch.Tensor, ba: torch.Tensor):
        """[T, nk (2 dk + 2 r dv)], [T, nk 2 r] (r = nv / nk, grouped by key head, transformers'
        fix_query_key_value_ordering) -> [q | k | v] [T, C], z [T, nv, dv], b, a [T, nv]."""
        t, r = qkvz.shape[0], self.nv // self.nk
        q, k, v, z = torch.split(qkvz.view(t, self.nk, -1), [self.dk, self.dk, r * self.dv, r * self.dv], dim=2)
        b, a = torch.split(ba.view(t, self.nk, 2 * r), [r, r], dim=2)
        mixed = torch.cat((q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)), dim=-1)
        return mixed, z.reshape(t, self.nv, self.dv), b.reshape(t, self.nv), a.reshape(t, self.nv)


class _Layer:
    def __init__(self, layer, kind: str, config, kernels: str):
        self.kind = kind
        self.ln_in = (layer.input_layernorm.weight, layer.input_layernorm.eps)
        self.ln_post = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
        self.mixer = _DeltaNet.of(layer.linear_attn) if kind == "linear_attention" else _Attention.of(layer.self_attn)
        mlp = layer.mlp
        self.moe, dense, self.act = moe_or_gated_mlp(mlp, config, kernels)
        self.gate, self.up, self.down = dense or (None, None, None)


class PagedQwen3NextRunner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a Qwen3NextForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node from its parent's states."""

    unsupported_reason = staticmethod(qwen3_next_unsupported_reason)

    def _bind(self, model) -> None:
        inner = model.model
        self._bind_parts(model.config, inner.embed_tokens.weight, inner.layers, inner.norm,
                         model.get_output_embeddings().weight, inner.rotary_emb)

    def _bind_parts(self, config, embed: torch.Tensor, layers, norm, lm_head: torch.Tensor, rotary) -> None:
        """The decoder's parts: embedding [V, H], decoder layer modules (of config.layer_types' kinds),
        final norm module, LM head [V, H], rotary module (a target's MTP layer binds its own:
        runners/paged_mtp.py)."""
        self.embed = embed
        self.layers = [_Layer(layer, kind, config, self.kernels) for layer, kind in zip(layers, config.layer_types)]
        self._index_layers()
        self.final_norm = (norm.weight, norm.eps)
        self.lm_head = lm_head
        self._bind_heads(config)
        self.inv_freq = rotary.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(rotary.attention_scaling)

    # -- the forward ------------------------------------------------------------------------------
    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype)  # [T, R], once per call
        rows = self._row_layout(cu, total, n)
        sum_ = self._sum_partials
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = qwen_norm(x, layer.ln_in)
            if layer.kind == "full_attention":
                a = layer.mixer
                q, gate = linear(h, *a.q).view(total, heads, 2 * dim).chunk(2, dim=-1)
                q = qwen_norm(q, a.q_norm)
                k = qwen_norm(linear(h, *a.k).view(total, kv_heads, dim), a.k_norm)
                v = linear(h, *a.v).view(total, kv_heads, dim)
                q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
                o = self._attend(self._attention_index[i], q, k, v, attn_lens, cu, n, self.scale)
                x = x + sum_(linear(o.reshape(total, -1) * torch.sigmoid(gate.reshape(total, -1)), *a.o))
            else:
                x = x + sum_(self._delta_net(layer.mixer, self.states[self._recurrent_index[i]], h, rows))
            h = qwen_norm(x, layer.ln_post)
            x = x + sum_(moe_or_mlp(layer, h, self._prefilling))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = qwen_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out

    def _delta_net(self, net: _DeltaNet, st, h: torch.Tensor, rows: tuple) -> torch.Tensor:
        """One Gated DeltaNet layer over the call's tokens h [T, H] -> its output [T, H]: a prefill in chunks
        from zero states (the final ones committed); a score call token by token from each row's state
        (committed, or the last snapshot), a snapshot written after each token."""
        index = rows.index
        batch, n = index.shape
        total = h.shape[0]
        mixed, z, b, a = net.project(h)
        beta = b.sigmoid()
        if net.beta_scale != 1.0:  # OLMo Hybrid's allow_neg_eigval: beta in [0, 2]
            beta = beta * net.beta_scale
        g = -net.a_log.float().exp() * F.softplus(a.float() + net.dt_bias)
        # each row's tokens in order, its padding (first) zeros: no input, no decay, no update
        by_row, beta, g = (torch.cat((t, torch.zeros_like(t[:1])))[index] for t in (mixed, beta, g))  # [B, n, ...]
        if self._prefilling:
            core = self._prefill_chunks(net, st, by_row, beta, g)
        elif st.by_steps(rows):  # the Triton path, or a token tree
            core = self._score_fused(net, st, by_row, beta, g, rows)
        else:
            core = self._score_block(net, st, by_row, beta, g, rows)
        packed = torch.zeros(total + 1, net.nv, net.dv, dtype=h.dtype, device=h.device)
        packed.index_copy_(0, index.reshape(-1), core.to(h.dtype).reshape(batch * n, net.nv, net.dv))
        core = gated_norm(packed[:total], z, net.norm).reshape(total, -1)
        return linear(core, *net.out)

    @staticmethod
    def _heads(net: _DeltaNet, y: torch.Tensor):
        """The convolution's output y [..., C] (model dtype) -> q, k [..., Hv, Dk] (L2-normed, q / sqrt(Dk);
        each key head serving nv / nk value heads), v [..., Hv, Dv], float32."""
        lead, r = y.shape[:-1], net.nv // net.nk
        q, k, v = torch.split(y, [net.nk * net.dk, net.nk * net.dk, net.nv * net.dv], dim=-1)
        q = q.reshape(*lead, net.nk, net.dk).float().repeat_interleave(r, dim=-2)
        k = k.reshape(*lead, net.nk, net.dk).float().repeat_interleave(r, dim=-2)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        return q / (net.dk ** 0.5), k, v.reshape(*lead, net.nv, net.dv).float()

    def _steps(self, net, st, by_row, beta, g, rows) -> torch.Tensor:
        """A score call's chain: token by token from each row's state (transformers' recurrent rule, op for op),
        a snapshot after each real token -> outputs [B, n, Hv, Dv] float32."""
        _, real, slot, start, _ = rows
        batch, n = real.shape
        ids = torch.arange(batch, device=by_row.device)
        conv = torch.where((start < 0)[:, None, None], st.conv[:batch], st.conv_tent[ids, start.clamp(min=0)])
        rec = st.start_rec(batch, start)
        weight, bias = net.conv, net.conv_bias
        outs = []
        for t in range(n):
            on = real[:, t]
            window = torch.cat((conv, by_row[:, t, :, None]), dim=-1)  # [B, C, K]
            # summed in float32, rounded once (as conv1d accumulates; bf16 products drift: see the module doc)
            y = (window.float() * weight.float()).sum(-1).to(weight.dtype) + (0 if bias is None else bias)
            q, k, v = self._heads(net, F.silu(y).to(by_row.dtype))  # [B, Hv, D]
            conv = torch.where(on[:, None, None], window[:, :, 1:], conv)
            decayed = rec * g[:, t].exp()[..., None, None]
            kv_mem = (decayed * k.unsqueeze(-1)).sum(dim=-2)
            delta = (v - kv_mem) * beta[:, t].float().unsqueeze(-1)
            updated = decayed + k.unsqueeze(-1) * delta.unsqueeze(-2)
            rec = torch.where(on[:, None, None, None], updated, rec)
            outs.append((updated * q.unsqueeze(-1)).sum(dim=-2))  # [B, Hv, Dv]
            # the snapshot after this token (a padded step writes back what is there)
            st.conv_tent[ids, slot[:, t]] = torch.where(on[:, None, None], conv, st.conv_tent[ids, slot[:, t]])
            st.rec_tent[ids, slot[:, t]] = torch.where(on[:, None, None, None], rec, st.rec_tent[ids, slot[:, t]])
        return torch.stack(outs, dim=1)

    def _score_block(self, net, st, by_row, beta, g, rows) -> torch.Tensor:
        """A score call's chain, its n tokens at once (the same recurrence as _steps, its reference): ~20 batched
        ops whatever n, where the steps take ~15 a token. The convolution through RecurrentStates.conv_steps (each
        row's windows from its state and tokens, their snapshots written); within the call the delta rule solves as
        one unit lower-triangular n x n system per head (as a prefill chunk does, from the row's state); every
        snapshot S_t = e^(G_t) S_0 + sum_(j <= t) e^(G_t - G_j) k_j d_j^T written in one scatter (padded positions
        to the spare slot) -> outputs [B, n, Hv, Dv] float32."""
        _, real, slot, start, _ = rows
        batch, n = real.shape
        ids = torch.arange(batch, device=by_row.device)
        rec = st.start_rec(batch, start)  # [B, Hv, Dk, Dv]
        q, k, v = self._heads(net, st.conv_steps(by_row, net.conv, net.conv_bias, rows, silu=True))  # [B, n, Hv, D]
        on = real[:, None, :, None].float()  # padding: no key, no value, no decay, no update
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, Hv, n, D]
        k, v = k * on, v * on
        beta, g = (t.float().transpose(1, 2) * real[:, None, :] for t in (beta, g))  # [B, Hv, n]
        decay = g.cumsum(-1)
        lower = torch.ones(n, n, dtype=torch.bool, device=by_row.device).tril()
        gap = torch.where(lower, decay[..., :, None] - decay[..., None, :], float("-inf")).exp()  # j <= t
        strict = (beta[..., None] * gap * (k @ k.transpose(-1, -2))).tril(-1)
        lead = decay.exp()[..., None]  # [B, Hv, n, 1]
        rhs = beta[..., None] * (v - lead * (k @ rec))
        eye = torch.eye(n, device=by_row.device)
        d = torch.linalg.solve_triangular(strict + eye, rhs, upper=False, unitriangular=True)  # [B, Hv, n, Dv]
        out = lead * (q @ rec) + (gap * (q @ k.transpose(-1, -2))) @ d
        snaps = lead[..., None] * rec[:, :, None] + torch.einsum("bhtj,bhjk,bhjv->bhtkv", gap, k, d)
        st.rec_tent[ids[:, None], slot] = snaps.transpose(1, 2)  # [B, n, Hv, Dk, Dv]
        return out.transpose(1, 2)

    @staticmethod
    def _score_fused(net, st, by_row, beta, g, rows) -> torch.Tensor:
        """A score call on the Triton path, or a token tree's on any: the convolution (RecurrentStates.conv_steps),
        then the delta rule, the L2 norms, the key heads' repeat and every snapshot (RecurrentStates.steps: one launch
        each on the Triton path) -> outputs [B, n, Hv, Dv] float32."""
        batch, n = rows.real.shape
        y = st.conv_steps(by_row, net.conv, net.conv_bias, rows, silu=True)  # [B, n, C]
        q, k, v = torch.split(y, [net.nk * net.dk, net.nk * net.dk, net.nv * net.dv], dim=-1)
        return st.steps(q.view(batch, n, net.nk, net.dk), k.view(batch, n, net.nk, net.dk),
                        v.view(batch, n, net.nv, net.dv), g, rows, beta=beta, qk_norm=True, scale=net.dk ** -0.5)

    def _prefill_chunks(self, net, st, by_row, beta, g) -> torch.Tensor:
        """A prefill from zero states: the convolution over each row at once, the delta rule in chunks of
        PREFILL_CHUNK tokens (runners/chunked_prefill.py: within a chunk the updates solve as one unit lower-triangular
        system, across chunks the state carries -- the WY form of FLA's and transformers' chunked kernels; the carry
        one launch on the Triton path), float32 -> outputs [B, n, Hv, Dv]; the final conv window and state committed."""
        batch = by_row.shape[0]
        y, last = prefill_conv(by_row.transpose(1, 2), net.conv, net.conv_bias, net.kernel)  # rows' padding first: zeros
        q, k, v = self._heads(net, F.silu(y).to(by_row.dtype).transpose(1, 2))  # [B, n, Hv, D]
        st.conv[:batch].copy_(last)
        state = st.rec[:batch].zero_()
        o = scalar_decay_prefill(st.chunk_scan, *(t.transpose(1, 2) for t in (q, k, v)), g.float().transpose(1, 2), state,
                                 PREFILL_CHUNK, beta=beta.float().transpose(1, 2))
        return o.transpose(1, 2)  # [B, n, Hv, Dv]
