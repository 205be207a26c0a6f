"""What the installed Triton offers beyond the oldest release the kernels run on.

Programmatic dependent launch (PDL: gdc_wait / gdc_launch_dependents in the kernels, the
launch_pdl launch option) compiles from Triton 3.5. Under an older Triton (3.4: torch 2.8's pin) the
kernels keep their PDL branches behind a constexpr that is never set, and a launcher asked for PDL
launches plainly (pdl_options), as it does on a GPU before sm_90. The kernels' only use of PDL is
the GEMV layer's chain (runners/paged_llama.py GEMV_PDL, off by default), so nothing else changes.
"""
from ._backend import cuda_capability, canonical_device, triton_version

# 3.4 has the functions but its gdc_wait does not compile (it takes _builder where 3.4's frontend
# passes _semantic: seen compiling the kernels for sm_90a with triton 3.4.0); 3.5 compiles them.
HAS_PDL = (triton_version() or (0, 0)) >= (3, 5)
if HAS_PDL:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
else:  # never reached by a kernel: its PDL constexpr stays False
    gdc_launch_dependents = gdc_wait = None


# PDL's instructions (griddepcontrol) need sm_90 (Hopper) or later: ptxas rejects them for an A100
# (sm_80) or an RTX 30xx / 40xx (sm_86 / sm_89), seen compiling the kernels for those targets here.
PDL_MIN_CAPABILITY = (9, 0)


def pdl_options(pdl: bool, device) -> dict:
    """The launch keywords of a programmatic dependent launch on ``device`` (a torch.device), or
    none (not asked, not CUDA, a GPU before sm_90, or a Triton without PDL: those launch plainly).
    Passed only when set, so a default launch keeps its cache key."""
    if not (pdl and HAS_PDL and device.type == "cuda"):
        return {}
    on_hopper = cuda_capability(canonical_device(device).index) >= PDL_MIN_CAPABILITY
    return {"PDL": True, "launch_pdl": True} if on_hopper else {}
