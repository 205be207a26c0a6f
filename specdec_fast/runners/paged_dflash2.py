"""PagedDFlash2Runner: a DFlash2 drafter (heads/dflash2.py) on DFlash's paged runner
(runners/paged_dflash.py), through its hooks: the block's embeddings times input_embedding_scale,
and each layer's attention / MLP sublayer wrapped by DFlash2's in-block convolution (block_conv
over the packed block tokens: whole blocks of block_size, rows fed nothing included). The context
entries, the cache, the attention and the block mask are DFlash's. The candidate selector's
tensors are kept here for the drafter (drafters/block_selector.py); it runs after the block.

The convolution is plain torch on every backend (elementwise over [T, H] plus one [H -> 2 taps H /
group] projection per sublayer; not measured against the layer's other work)."""
from ._linear import linear
from .paged_dflash import PagedDFlashRunner
from ..heads.dflash2 import block_conv, conv_coefficients


class PagedDFlash2Runner(PagedDFlashRunner):
    """PagedDFlashRunner for a DFlash2Head (same arguments)."""

    def __init__(self, head, embed, lm_head, **kwargs):
        if getattr(head, "variant", None) != "dflash2":
            raise ValueError(f"PagedDFlash2Runner runs DFlash2 drafters, got {type(head).__name__}")
        super().__init__(head, embed, lm_head, **kwargs)
        self.embedding_scale = head.input_embedding_scale
        self.conv_taps = head.conv_taps
        self.convs = [tuple((c.base_kernel, c.kernel_projection.weight) for c in (layer.attention_conv, layer.mlp_conv))
                      for layer in head.layers] if head.conv_taps else None
        sel = head.candidate_selector
        if self.vocab_size > sel.predecessor_codebook.shape[0]:
            raise ValueError(f"the DFlash2 selector's codebooks cover {sel.predecessor_codebook.shape[0]} tokens, the "
                             f"target's lm_head {self.vocab_size}")
        self.selector_top_k = sel.top_k
        self.predecessor_codebook, self.successor_codebook = sel.predecessor_codebook, sel.successor_codebook
        self.selector_projection = sel.hidden_projection.weight

    def _embed(self, flat):
        h = super()._embed(flat)
        return h if self.embedding_scale == 1.0 else h * self.embedding_scale

    def _mix_in(self, i, sublayer, x, n):
        if self.convs is None:
            return x, None
        base, projection = self.convs[i][sublayer]
        c = conv_coefficients(x, projection, self.conv_taps)  # [T, 2, taps, G]
        return block_conv(x, c[:, 0], base[0], n), c[:, 1]

    def _out(self, i, sublayer, x, weight_bias, h, mixing, n):
        if mixing is None:
            return super()._out(i, sublayer, x, weight_bias, h, mixing, n)
        return h + block_conv(linear(x, *weight_bias), mixing, self.convs[i][sublayer][0][1], n)
