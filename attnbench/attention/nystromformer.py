"""Nyströmformer (Xiong et al. 2021), our own implementation.

The softmax attention S = softmax(QKᵀ/√d) is approximated from m landmarks (paper eq. 15):

    Ŝ = softmax(Q K̃ᵀ/√d) · A⁺ · softmax(Q̃ Kᵀ/√d),     A = softmax(Q̃ K̃ᵀ/√d)

with Q̃, K̃ the segment means of Q and K (section "Selection of landmarks": m segments of n/m
consecutive positions, per head), and A⁺ the Moore–Penrose pseudo-inverse of the m × m
landmark kernel, computed by the paper's iteration (from Razavi et al. 2014):

    Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞),     Z_{j+1} = ¼ Z_j (13I − A Z_j (15I − A Z_j (7I − A Z_j)))

``pinv_iterations`` times (6 in the paper). The output is Ŝ V, multiplied out in the cheap
order F (A⁺ (B V)): B V is m × d, A⁺ (B V) is m × d, so nothing n × n or even n × m
is stored: both softmax·V products run in PyTorch's fused ``scaled_dot_product_attention``.
A depthwise convolution of V along the sequence, one kernel of ``conv_kernel`` taps per head,
is added as in the authors' code (33 taps for their 512-token pre-training, 35 for LRA;
``conv_kernel=0`` leaves it out). Time is O(n·m·d + m³·h), memory O(n·m + m²·h) at most.

Choices of ours where the paper is silent:

* Z₀ is scaled per (sequence, head) matrix, as the paper writes it. The authors' code and
  ``nystrom-attention`` take the max column and row sums over the whole batch and every head,
  so a sequence's output there depends on the others in its batch. In exact arithmetic both
  starts lead to A⁺, but after 6 steps the two differ unless batch and heads are 1.
* Landmarks are means over each sequence's real positions only: the r-th real token (in
  order, r = 0..L−1 of L real tokens) belongs to segment ⌊r·m/L⌋. With L divisible by m that
  is the paper's consecutive segments of L/m; otherwise segments hold ⌊L/m⌋ or ⌈L/m⌉ tokens.
  With scattered padding the segments are laid over the real tokens in order, skipping the
  padded ones, so the landmarks equal those of the sequence with its padding taken out. For
  L < m (and n < m without padding) each real token is its own landmark and the m − L empty
  segments are masked out of every softmax and of A (whose pseudo-inverse then is that of its
  non-empty block): Nyströmformer with a landmark per token is exact softmax attention, given
  enough pseudo-inverse iterations (relative error 4.2e-2 at the default 6, 7e-14 at 40).
* Padded keys are masked out of softmax(Q̃ Kᵀ) and padded rows of the input are zeroed
  before the projections (so a non-finite value there reaches nothing); V is zeroed at padded
  positions before the convolution, which therefore sees padding as zeros in place: with right
  padding that is exactly the sequence cut short, whose convolution pads with zeros too.
* The pooling is a reshape and mean when there is no padding and m divides n, otherwise a
  (b, m, n) matrix of segment weights built arithmetically from the real lengths (no
  data-dependent indexing, so the forward runs on meta tensors for the memory model).
* ``nystrom-attention`` differs from us in four more ways. It zero-pads n up to a multiple
  of m at the front, where the zero rows dilute the first landmark and, without a mask, are
  keys in softmax(Q̃Kᵀ); with a mask its segments stay fixed blocks of positions (a masked
  mean each) rather than following the real length. Its QKV projection has no bias. It
  scales Q by 1/√d before taking the landmarks (the same numbers: the mean is linear). And
  it multiplies (F A⁺)(B V), an n × m by m × m product per head that F (A⁺ (B V)) avoids.
  With m dividing n, no mask and zero QKV biases it computes what we compute, exactly for
  batch 1 and one head, and for any batch and heads once its Z₀ is taken per matrix
  (tests/test_nystromformer.py). More iterations do not make the two meet in float32: the
  iteration reaches A⁺'s small singular values only slowly, and from different starts.
* Causal masking is refused: a landmark is a mean over a segment, so every query would see
  the later positions of the segments it attends to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.attention.base import MultiHeadAttention, declare
from attnbench.validators import check_bool, check_int

# the most pseudo-inverse iterations: each is a Python step of four m × m matmuls per head
# (traced one by one on meta); 40 already reach float64's precision (the module's docstring)
MAX_PINV_ITERATIONS = 100
CONV_KERNEL = 33  # the authors' kernel for their 512-token pre-training


@dataclass
class NystromformerConfig:
    num_landmarks: int = 64
    pinv_iterations: int = 6
    conv_kernel: int = CONV_KERNEL  # taps of the depthwise convolution of V, odd; 0 = none
    causal: bool = False

    def __post_init__(self) -> None:
        check_int("num_landmarks", self.num_landmarks)
        check_int("pinv_iterations", self.pinv_iterations, high=MAX_PINV_ITERATIONS)
        check_int("conv_kernel", self.conv_kernel, low=0)
        if self.conv_kernel % 2 == 0 and self.conv_kernel:
            raise ValueError(
                "conv_kernel: must be 0 (no convolution) or odd, so the output keeps n "
                f"positions; got {self.conv_kernel}"
            )
        check_bool("causal", self.causal)
        if self.causal:
            raise ValueError(
                "causal: Nyströmformer cannot be causal (a landmark is the mean of a segment, "
                "so each query would see later positions through it); allowed: false"
            )


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """A⁺ of each m × m matrix in ``a`` (..., m, m) by the paper's iteration from Z₀ =
    Aᵀ/(‖A‖₁‖A‖∞), each matrix scaled by its own norms.

    ‖A‖₁ is the largest column sum and ‖A‖∞ the largest row sum (A is a softmax, so no
    absolute values are needed); an all-zero A (a sequence with no real token) gets Z = 0.
    Each step is four m × m matmuls; the three "cI − X·Y" and the ¼ are folded into
    ``baddbmm`` (c·I + α·X·Y in one pass), so only 7I − AZ is a separate elementwise op.
    """
    *batch, m, _ = a.shape
    scale = a.sum(-2).amax(-1) * a.sum(-1).amax(-1)  # (...,): ‖A‖₁ ‖A‖∞
    z = a.mT / scale.clamp_min(torch.finfo(a.dtype).tiny)[..., None, None]
    a, z = a.reshape(-1, m, m), z.reshape(-1, m, m)  # baddbmm wants one batch dimension
    eye = torch.eye(m, dtype=a.dtype, device=a.device)
    for _ in range(iterations):
        az = torch.bmm(a, z)
        t = torch.baddbmm(15 * eye, az, 7 * eye - az, alpha=-1)  # 15I − AZ(7I − AZ)
        t = torch.baddbmm(3.25 * eye, az, t, alpha=-0.25)  # ¼(13I − AZ·t)
        z = torch.bmm(z, t)
    return z.view(*batch, m, m)


def segment_weights(
    mask: Tensor | None, b: int, n: int, m: int, like: Tensor
) -> tuple[Tensor, Tensor | None]:
    """The (b, m, n) matrix P with P X = the m segment means of X's real rows, and a bool
    (b, m) that is True where a segment holds no real token (None when none can be empty).

    Real token number r (counting real tokens only, in order) of a sequence with L real tokens
    goes to segment ⌊r·m/L⌋, so segments are as even as L allows and none is empty if L ≥ m.
    """
    slots = torch.arange(m, device=like.device)[None, :, None]  # (1, m, 1)
    if mask is None:
        rank = torch.arange(n, device=like.device).expand(b, n)  # (b, n)
        length = torch.full((b, 1), n, device=like.device)
    else:
        real = ~mask
        rank = real.cumsum(-1) - 1  # (b, n): the real token's place among the real ones
        length = real.sum(-1, keepdim=True).clamp(min=1)  # (b, 1)
    member = (rank * m).div(length, rounding_mode="floor")[:, None, :] == slots  # (b, m, n)
    if mask is not None:
        member = member & real[:, None, :]
    counts = member.sum(-1, keepdim=True)  # (b, m, 1)
    weights = member.to(like.dtype) / counts.clamp(min=1).to(like.dtype)
    empty = None if mask is None and n >= m else counts[..., 0] == 0
    return weights, empty


@declare(
    "nystromformer",
    config=NystromformerConfig,
    causal=False,
    budget="num_landmarks",
    cannot_decode=(
        "has no causal form: its landmarks are means over segments of the whole sequence, "
        "which every new token changes"
    ),
    summary="Nyströmformer: segment-mean landmarks, iterative pseudo-inverse, conv of V; O(n·m)",
    cannot_pack=(
        "its landmarks are means over segments of the whole row, so every landmark mixes the "
        "documents it spans and every output reads every landmark"
    ),
)
class NystromformerAttention(MultiHeadAttention):
    def __init__(
        self, *, d_model: int, n_heads: int, max_seq_len: int, cfg: NystromformerConfig
    ) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, cfg=cfg)
        kernel = cfg.conv_kernel
        if kernel > (most := max(2 * max_seq_len - 1, CONV_KERNEL)):  # taps that add nothing
            raise ValueError(  # but time: a CPU's depthwise conv of 10⁶ taps runs for hours
                f"conv_kernel: must be at most {most} (2n - 1, or the authors' {CONV_KERNEL}: "
                f"a tap further than n - 1 positions from its query reads only padding), "
                f"got {kernel}"
            )
        # the authors' parameter: one (kernel × 1) filter per head, as a Conv2d over (n, dh)
        # planes, so weights port from their code and nystrom-attention's res_conv unchanged
        # (and initialised as theirs); :meth:`convolve` applies it
        self.conv = (
            nn.Conv2d(
                n_heads, n_heads, (kernel, 1), padding=(kernel // 2, 0), groups=n_heads, bias=False
            )
            if kernel
            else None
        )

    def landmarks_of(self, n: int, padded: bool) -> int:
        """m: the configured number, or n when the sequence is shorter and unpadded (then each
        token is a landmark; with padding the empty segments are masked instead)."""
        return self.cfg.num_landmarks if padded else min(self.cfg.num_landmarks, n)

    def attend(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        b, n, _ = x.shape
        mask = key_padding_mask
        if mask is not None:  # a padded row holds nothing, not even an inf or a NaN
            x = x.masked_fill(mask[..., None], 0.0)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (b, n, d)
        m = self.landmarks_of(n, mask is not None)
        if mask is None and n % m == 0:  # the paper's segments: a reshape and a mean
            q_l, k_l = q.unflatten(1, (m, n // m)).mean(2), k.unflatten(1, (m, n // m)).mean(2)
            empty = None
        else:
            weights, empty = segment_weights(mask, b, n, m, q)  # (b, m, n)
            q_l, k_l = torch.bmm(weights, q), torch.bmm(weights, k)  # (b, m, d)
        if mask is not None and self.conv is not None:  # the convolution sees padding as 0
            v = v.masked_fill(mask[..., None], 0.0)
        residual = None if self.conv is None else self.convolve(v)  # (b, n, d)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (b, h, n, dh)
        q_l, k_l = self.split_heads(q_l), self.split_heads(k_l)  # (b, h, m, dh)

        kernel = (q_l * self.scale) @ k_l.mT  # (b, h, m, m): A before its softmax
        if empty is not None:
            kernel = kernel.masked_fill(empty[:, None, None, :], float("-inf"))
        kernel = kernel.softmax(dim=-1)
        if empty is not None:  # an empty landmark's row is 0 (also the NaN of an all-empty row)
            kernel = kernel.masked_fill(empty[:, None, :, None], 0.0)

        keys = None if mask is None else ~mask[:, None, None, :]  # (b, 1, 1, n)
        bv = F.scaled_dot_product_attention(q_l, k, v, attn_mask=keys)  # (b, h, m, dh): B V
        w = iterative_pinv(kernel, self.cfg.pinv_iterations) @ bv  # (b, h, m, dh): A⁺ (B V)
        slots = None if empty is None else ~empty[:, None, None, :]  # (b, 1, 1, m)
        out = F.scaled_dot_product_attention(q, k_l, w, attn_mask=slots)  # F (A⁺ (B V))
        if residual is None:
            return self.merge_heads(out)  # (b, n, d)
        # added into the convolution's fresh (b, n, d) output: the head merge's copy for free
        return residual.view(b, n, self.n_heads, self.head_dim).add_(out.transpose(1, 2)).flatten(2)

    def convolve(self, v: Tensor) -> Tensor:
        """The depthwise convolution of V along the sequence, (b, n, d) -> (b, n, d).

        Run as one filter per channel (each head's filter repeated over its dh channels) on
        V's own memory seen as a channels-last (b, d, 1, n) image: no copy of V, and the CPU
        kernel then allocates only its output, which is already V's (b, n, d) layout. The
        head-planes layout of the authors' code (``self.conv`` applied to (b, h, n, dh)) costs
        a contiguous copy of V and ~8× its size in scratch inside the kernel, which the memory
        model (meta) cannot see, and runs ~10× slower on a CPU; the sums are the same.
        """
        d = v.shape[-1]
        kernel = self.cfg.conv_kernel
        weight = self.conv.weight.view(self.n_heads, 1, 1, kernel)  # (h, 1, kh=1, kw)
        weight = weight.repeat_interleave(self.head_dim, dim=0)  # (d, 1, 1, kernel)
        image = v.transpose(1, 2).unsqueeze(2)  # (b, d, 1, n), channels-last strides
        out = F.conv2d(image, weight, padding=(0, kernel // 2), groups=d)  # (b, d, 1, n)
        return out.squeeze(2).transpose(1, 2)  # (b, n, d), a view

    def context_elements(self, n: int) -> int:
        """The landmarks, per head: the m landmark keys K̃ and the m summaries
        W = A⁺ softmax(Q̃ Kᵀ) V they weight (m × d_h each; m = min(num_landmarks, n)), 2·m·d.
        A query's attention is softmax(q K̃ᵀ) W: everything of the context that reaches it
        through attention is in K̃ and W (Q̃, A⁺ and B V only make W). Plus the
        convolution's window: V at the min(conv_kernel, n) positions around the query,
        min(conv_kernel, n)·d, a local path every output also reads (0 without it)."""
        landmarks = 2 * self.landmarks_of(n, False) * self.d_model
        return landmarks + min(self.cfg.conv_kernel, n) * self.d_model

    def attention_flops(self, b: int, n: int) -> int:
        """Between the projections, without padding (m = min(num_landmarks, n)):

        segment means by the weights matrix when m does not divide n, 2·2·m·n·d; A = Q̃K̃ᵀ,
        2·m²·d; B V and F W as fused sdpa, 4·m·n·d each; each pseudo-inverse step four m × m
        matmuls per head, 8·h·m³; A⁺ (B V), 2·m²·d; the convolution, 2·n·d·kernel.
        """
        d, h, m = self.d_model, self.n_heads, self.landmarks_of(n, False)
        pool = 0 if n % m == 0 else 4 * m * n * d
        pinv = self.cfg.pinv_iterations * 8 * h * m**3
        conv = 2 * n * d * self.cfg.conv_kernel
        return b * (pool + 4 * m * m * d + 8 * m * n * d + pinv + conv)

    def frozen_flops(self, b: int, n: int) -> int:
        """The segment weights are a constant: their products with Q and K need one gradient."""
        m = self.landmarks_of(n, False)
        return 0 if n % m == 0 else 4 * b * m * n * self.d_model

    def recomputed_flops(self, b: int, n: int) -> int:
        """Both fused sdpa backwards recompute their scores, 2·m·n·d each."""
        return 4 * b * self.landmarks_of(n, False) * n * self.d_model
