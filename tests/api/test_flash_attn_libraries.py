"""The flash_attn stand-in beside the libraries that probe flash-attn (real xformers, diffusers and
transformers): an import that works without it works with it; the names and signatures those libraries
and real projects use are flash-attn 2.8.3's (flash_attn_2_8_3.py); the compiled extension's functions
and the private forward/backward agree with fa_attn's autograd; errors flash-attn raises as
RuntimeError are RuntimeErrors; modules fa does not provide fail with fa's message."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import fa_attn
import pytest
import torch
from fa_attn.standin import compat as flash_attn_compat
from flash_attn_2_8_3 import EXTENSION, REQUIRED, SIGNATURES

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, *, stand_in: bool) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter (library imports are process-wide state), with or without the stand-in."""
    prelude = "import fa_attn; fa_attn.install_as_flash_attn()\n" if stand_in else ""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")]),
        "XFORMERS_MORE_DETAILS": "0",
    }
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", prelude + code],
        capture_output=True, text=True, env=env, check=False, timeout=300,
    )  # fmt: skip


# ---- imports that work without the stand-in work with it --------------------------------------------

# Each library's import, and what it decided about flash-attn; one interpreter runs them all (importing
# diffusers takes most of the time), once without the stand-in and once with it.
PROBE = """
import importlib.util, traceback
def probe(name, code):
    if importlib.util.find_spec(name.split('.')[0]) is None:
        print('SKIP', name); return
    try:
        exec(code, {})
    except Exception:
        print('FAIL', name, traceback.format_exc().replace(chr(10), ' | ')); return
    print('OK', name)
probe('xformers', "import xformers.ops; import xformers.ops.fmha.flash as f; print('XFORMERS_FLASH', f.FLASH_VERSION)")
probe('diffusers', "from diffusers import UNet2DConditionModel; "
      "from diffusers.models import attention_dispatch as d; print('DIFFUSERS_FLASH', d._CAN_USE_FLASH_ATTN)")
probe('transformers', "from transformers import AutoModelForCausalLM; "
      "from transformers.utils import is_flash_attn_2_available as a; print('TRANSFORMERS_FLASH', a())")
if 'flash_attn' in sys.modules:
    probe('diffusers.flash', DIFFUSERS_FLASH)
"""
DIFFUSERS_FLASH = """
import torch, fa_attn
from diffusers.models.attention_dispatch import dispatch_attention_fn
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 6, 4, 16, generator=g) for _ in range(3))
flash = dispatch_attention_fn(q, k, v, is_causal=True, backend='flash')
native = dispatch_attention_fn(q, k, v, is_causal=True, backend='native')
print('DIFFUSERS_DIFF', float((flash - native).abs().max()), fa_attn.last_dispatch().path)
"""
LIBRARIES = ("xformers", "diffusers", "transformers")


@pytest.fixture(scope="module")
def probes() -> dict[bool, str]:
    """PROBE's output without (False) and with (True) the stand-in."""
    code = f"import sys\nDIFFUSERS_FLASH = {DIFFUSERS_FLASH!r}\n{PROBE}"
    return {stand_in: run_python(code, stand_in=stand_in).stdout for stand_in in (False, True)}


def need(library: str) -> None:
    """Skip where the library is not installed (found, not imported: importing xformers takes seconds)."""
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed (pip install -e '.[test]' installs it)")


def _lines(output: str, word: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(word + " ")]


@pytest.mark.parametrize("library", LIBRARIES)
def test_an_import_that_works_without_the_stand_in_works_with_it(
    probes: dict[bool, str], library: str
) -> None:
    need(library)
    assert f"OK {library}" in _lines(probes[False], "OK"), probes[False][-2000:]
    assert f"OK {library}" in _lines(probes[True], "OK"), _lines(probes[True], "FAIL")


def test_xformers_takes_the_stand_in_as_flash_attn(probes: dict[bool, str]) -> None:
    need("xformers")
    assert f"XFORMERS_FLASH {flash_attn_compat.SHIM_VERSION}" in probes[True].splitlines()


def test_diffusers_enables_its_flash_backend_on_the_stand_in(probes: dict[bool, str]) -> None:
    need("diffusers")
    assert "DIFFUSERS_FLASH False" in probes[False].splitlines()
    assert "DIFFUSERS_FLASH True" in probes[True].splitlines()


def test_diffusers_flash_backend_runs_through_fa_attn(probes: dict[bool, str]) -> None:
    need("diffusers")
    lines = _lines(probes[True], "DIFFUSERS_DIFF")
    assert lines, _lines(probes[True], "FAIL")
    _, diff, path = lines[0].split()
    assert float(diff) < 1e-5
    assert path == "fallback"  # fa_attn ran the call (on a CPU, its fallback)


def test_installing_after_diffusers_is_imported_enables_its_flash_backend() -> None:
    """diffusers decides at import whether flash_attn is there (_CAN_USE_FLASH_ATTN and the functions it
    imported): installing the stand-in afterwards must refresh that, as it does transformers' caches."""
    need("diffusers")
    code = (
        "from diffusers.models import attention_dispatch as d\n"
        "print('BEFORE', d._CAN_USE_FLASH_ATTN)\n"
        "import fa_attn; fa_attn.install_as_flash_attn()\n"
        "print('AFTER', d._CAN_USE_FLASH_ATTN)\n" + DIFFUSERS_FLASH
    )
    result = run_python(code, stand_in=False)
    lines = result.stdout.splitlines()
    assert "BEFORE False" in lines, result.stderr[-2000:]
    assert "AFTER True" in lines, result.stderr[-2000:]
    diff = _lines(result.stdout, "DIFFUSERS_DIFF")
    assert diff, result.stderr[-2000:]
    assert float(diff[0].split()[1]) < 1e-5


DIFFUSERS_RING_BACKWARD = """
import torch, torch.nn.functional as F
from diffusers.models import attention_dispatch as d

class Ctx:  # what torch.autograd gives diffusers' ops: saved tensors and attributes
    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

g = torch.Generator().manual_seed(0)
q, k, v, dout = (torch.randn(2, 8, 4, 16, generator=g, dtype=torch.float64) for _ in range(4))
blocks = (slice(0, 4), slice(4, 8))
ctxs, outs, lses = [], [], []
for s in blocks:
    ctx = Ctx()
    out, lse = d._flash_attention_forward_op(ctx, q, k[:, s], v[:, s], scale=0.3, return_lse=True)
    ctxs.append(ctx); outs.append(out); lses.append(lse)
lse = torch.logsumexp(torch.stack(lses), dim=0)  # (B, S, H): diffusers' layout
out = sum(o * torch.exp(l - lse).unsqueeze(-1) for o, l in zip(outs, lses))
grads = [d._flash_attention_backward_op(c, dout, query=q, key=k[:, s], value=v[:, s], out=out, lse=lse)
         for c, s in zip(ctxs, blocks)]
dq = sum(gr[0] for gr in grads)
dk, dv = (torch.cat([gr[i] for gr in grads], dim=1) for i in (1, 2))
leaves = [t.clone().requires_grad_() for t in (q, k, v)]
ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves), scale=0.3).transpose(1, 2)
want = torch.autograd.grad(ref, leaves, dout)
print('RING_OUT', float((out - ref).abs().max()))
print('RING_GRAD', max(float((a - b).abs().max()) for a, b in zip((dq, dk, dv), want)))
"""


def test_diffusers_context_parallel_backward_reads_the_merged_out_and_lse() -> None:
    """diffusers' ring attention (TemplatedRingAttention) re-drives its flash backward op once per key block
    with the out and lse merged over all blocks; here its own forward and backward ops in one process, two
    blocks: the gradients are full attention's (off by 1.95 with main's private backward, 1e-15 outputs both)."""
    need("diffusers")
    result = run_python(DIFFUSERS_RING_BACKWARD, stand_in=True)
    out_err, grad_err = (_lines(result.stdout, word) for word in ("RING_OUT", "RING_GRAD"))
    assert out_err, result.stderr[-3000:]
    assert float(out_err[0].split()[1]) < 1e-6
    assert float(grad_err[0].split()[1]) < 1e-6


def test_transformers_sees_flash_attn_only_with_the_stand_in(probes: dict[bool, str]) -> None:
    """Steps 1-3 of its check pass (_standin.py's docstring); step 4, a CUDA device, is the machine's."""
    need("transformers")
    assert "TRANSFORMERS_FLASH False" in probes[False].splitlines()
    assert any(line.startswith("TRANSFORMERS_FLASH ") for line in probes[True].splitlines())


def test_transformers_flash_attention_2_on_a_cpu_points_to_hf_register() -> None:
    status = fa_attn.install_as_flash_attn()
    flash_attn_compat.uninstall_as_flash_attn()
    assert "fa_attn.hf.register()" in status.message


# ---- signatures ---------------------------------------------------------------------------------


def _parameters(fn: object) -> list[tuple[str, object, inspect._ParameterKind]]:
    return [
        (p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default, p.kind)
        for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    ]


ALL_FUNCTIONS = [(module, name) for module, functions in SIGNATURES.items() for name in functions]


@pytest.mark.usefixtures("stand_in")
@pytest.mark.parametrize(("module", "name"), ALL_FUNCTIONS, ids=[n for _, n in ALL_FUNCTIONS])
def test_signature_is_flash_attn_2_8_3s(module: str, name: str) -> None:
    """flash-attn's parameters, in its order, with its defaults, each passable by position or keyword;
    fa's own additions (return_lse) come after, keyword-only with a default: every call written for
    flash-attn binds the same way."""
    ours = _parameters(getattr(importlib.import_module(module), name))
    theirs = SIGNATURES[module][name]
    assert [(n, d) for n, d, _ in ours[: len(theirs)]] == theirs
    assert {kind for _, _, kind in ours[: len(theirs)]} == {inspect.Parameter.POSITIONAL_OR_KEYWORD}
    assert all(k == inspect.Parameter.KEYWORD_ONLY and d is not REQUIRED for _, d, k in ours[len(theirs) :])


@pytest.mark.usefixtures("stand_in")
@pytest.mark.parametrize("name", list(EXTENSION))
def test_extension_functions_take_flash_apis_arguments(name: str) -> None:
    from flash_attn.flash_attn_interface import flash_attn_gpu

    assert [n for n, _, _ in _parameters(getattr(flash_attn_gpu, name))] == EXTENSION[name]


@pytest.mark.usefixtures("stand_in")
def test_modules_have_a_file_and_the_package_its_interface() -> None:
    import flash_attn
    import flash_attn.bert_padding

    assert Path(flash_attn.__file__).is_file()
    assert Path(flash_attn.bert_padding.__file__).is_file()
    assert flash_attn.flash_attn_interface.flash_attn_func is fa_attn.flash_attn_func


def test_running_the_stand_in_module_gives_no_runpy_warning() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "kernels")}
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "fa_attn.flash_attn_compat", "--status"],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr
    assert "gives fa_attn" in done.stdout


# ---- what fa does not provide ----------------------------------------------------------------------

# Modules real projects import from flash-attn 2.8 (issue 26), and the alternative fa's message names.
NOT_PROVIDED = {
    "flash_attn.ops.layer_norm": "flash_attn.ops.triton.layer_norm.layer_norm_fn",
    "flash_attn.ops.rms_norm": "flash_attn.ops.triton.layer_norm.rms_norm_fn",
    "flash_attn.cute.interface": "FlashAttention-4",
    "flash_attn.models.llama": "transformers",
}


@pytest.mark.usefixtures("stand_in")
@pytest.mark.parametrize("module", list(NOT_PROVIDED))
def test_a_module_fa_does_not_provide_fails_with_fas_message(module: str) -> None:
    with pytest.raises(ModuleNotFoundError, match="does not provide") as raised:
        importlib.import_module(module)
    assert NOT_PROVIDED[module] in str(raised.value)


@pytest.mark.usefixtures("stand_in")
def test_a_probe_that_catches_import_error_takes_its_own_path() -> None:
    try:
        from flash_attn.ops.layer_norm import dropout_add_layer_norm  # noqa: F401
    except ImportError:
        took_own_path = True
    else:
        took_own_path = False
    assert took_own_path
    assert hasattr(importlib.import_module("flash_attn.flash_attn_interface"), "flash_attn_cuda") is False


# ---- the compiled extension's functions and the privates -------------------------------------------


def _qkv(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(2, 5, 4, 16, generator=g, dtype=dtype),
        torch.randn(2, 7, 2, 16, generator=g, dtype=dtype),
        torch.randn(2, 7, 2, 16, generator=g, dtype=dtype),
    )


def _autograd_reference(q, k, v, dout, **options):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = fa_attn.flash_attn_func(*leaves, return_lse=True, **options)
    out.backward(dout)
    return out.detach(), lse, [t.grad for t in leaves]


@pytest.mark.usefixtures("stand_in")
def test_extension_fwd_and_bwd_as_xformers_calls_them() -> None:
    from flash_attn.flash_attn_interface import flash_attn_gpu

    q, k, v = _qkv()
    dout = torch.randn_like(q)
    out, lse, probs, rng_state = flash_attn_gpu.fwd(
        q, k, v, None, None, 0.0, 0.3, True, -1, 0, 0.0, False, None
    )
    want_out, want_lse, want_grads = _autograd_reference(q, k, v, dout, softmax_scale=0.3, causal=True)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)
    assert (probs.numel(), rng_state.shape, rng_state.dtype) == (0, (2,), torch.int64)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    results = flash_attn_gpu.bwd(
        dout, q, k, v, out, lse, *grads, None, 0.0, 0.3, True, -1, 0, 0.0, False, None, rng_state
    )
    for given, returned, want in zip(grads, results[:3], want_grads, strict=True):
        assert returned is given  # written into the caller's tensors
        torch.testing.assert_close(given, want)
    torch.testing.assert_close(results[3][..., :5], (dout * out).sum(-1).transpose(1, 2).float())
    assert results[3].shape == (2, 4, 128)


@pytest.mark.usefixtures("stand_in")
def test_varlen_fwd_reads_seqused_k_and_leftpad_k() -> None:
    """flash-attn's BlockInfo: sequence b's keys are rows cu_k[b] + leftpad[b] .. cu_k[b] + seqused[b]."""
    from flash_attn.flash_attn_interface import flash_attn_gpu

    g = torch.Generator().manual_seed(2)
    q = torch.randn(5, 2, 8, generator=g, dtype=torch.float64)
    k = torch.randn(12, 2, 8, generator=g, dtype=torch.float64)
    v = torch.randn(12, 2, 8, generator=g, dtype=torch.float64)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 12], dtype=torch.int32)
    used = torch.tensor([5, 4], dtype=torch.int32)
    pad = torch.tensor([1, 0], dtype=torch.int32)
    out, lse, _, _ = flash_attn_gpu.varlen_fwd(
        q,
        k,
        v,
        None,
        cu_q,
        cu_k,
        used,
        pad,
        None,
        None,
        3,
        6,
        0.0,
        0.25,
        False,
        True,
        -1,
        -1,
        0.0,
        False,
        None,
    )
    keys = [(1, 5), (6, 10)]  # (first row, end row) per sequence
    for b, (first, end) in enumerate(keys):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        want, want_lse = fa_attn.flash_attn_func(
            q[rows][None],
            k[first:end][None],
            v[first:end][None],
            softmax_scale=0.25,
            causal=True,
            return_lse=True,
        )
        torch.testing.assert_close(out[rows], want[0])
        torch.testing.assert_close(lse[:, rows], want_lse[0])


@pytest.mark.usefixtures("stand_in")
def test_private_forward_and_backward_match_autograd() -> None:
    from flash_attn.flash_attn_interface import (
        _flash_attn_backward,
        _flash_attn_forward,
        _wrapped_flash_attn_backward,
        _wrapped_flash_attn_forward,
    )

    q, k, v = _qkv()
    dout = torch.randn_like(q)
    want_out, want_lse, want_grads = _autograd_reference(q, k, v, dout, softmax_scale=0.3, window_size=(2, 1))
    for forward, backward in ((_flash_attn_forward, _flash_attn_backward), (_wrapped_flash_attn_forward, _wrapped_flash_attn_backward)):  # fmt: skip
        out, lse, _, rng_state = forward(q, k, v, 0.0, 0.3, False, 2, 1, 0.0, None, False)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(lse, want_lse)
        grads = [torch.zeros_like(t) for t in (q, k, v)]
        backward(dout, q, k, v, out, lse, *grads, 0.0, 0.3, False, 2, 1, 0.0, None, False, rng_state)
        for got, want in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(got, want)


@pytest.mark.usefixtures("stand_in")
def test_private_varlen_forward_and_backward_match_autograd() -> None:
    from flash_attn.flash_attn_interface import (
        _wrapped_flash_attn_varlen_backward,
        _wrapped_flash_attn_varlen_forward,
    )

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(7, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = fa_attn.flash_attn_varlen_func(*leaves, cu, cu, 4, 4, softmax_scale=0.35, causal=True)
    want.backward(dout)
    out, lse, _, _ = _wrapped_flash_attn_varlen_forward(q, k, v, cu, cu, 4, 4, 0.0, 0.35, True)
    torch.testing.assert_close(out, want.detach())
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    softmax_d = _wrapped_flash_attn_varlen_backward(
        dout, q, k, v, out, lse, *grads, cu, cu, 4, 4, 0.0, 0.35, True, -1, 0, 0.0, None, False
    )
    assert softmax_d.shape == (2, 7 + 128 * 2)
    for got, leaf in zip(grads, leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad)


@pytest.mark.usefixtures("stand_in")
def test_wrapped_forward_compiles_with_fullgraph() -> None:
    from flash_attn.flash_attn_interface import _wrapped_flash_attn_forward

    q, k, v = _qkv(torch.float32)

    def f(q, k, v):
        return _wrapped_flash_attn_forward(q, k, v, 0.0, 0.25, True, -1, 0, 0.0, None, False)[0]

    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v), f(q, k, v))


# ---- RuntimeError where flash-attn raises RuntimeError -----------------------------------------------


def test_bad_block_table_is_a_runtime_error_as_in_flash_attn() -> None:
    """flash-attn's own tests: pytest.raises(RuntimeError, match="block_table")."""
    q = torch.randn(1, 1, 2, 8)
    cache = torch.randn(4, 16, 2, 8)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="block_table"):
        fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=40, block_table=table)
    with pytest.raises(ValueError, match="block_table"):  # fa's documented type still holds
        fa_attn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=40, block_table=table)


def test_bad_shape_is_a_runtime_error_and_a_value_error() -> None:
    q = torch.randn(1, 4, 3, 8)
    k = torch.randn(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="kv heads") as raised:
        fa_attn.flash_attn_func(q, k, k)
    assert isinstance(raised.value, ValueError)


# ---- bert_padding's other names ---------------------------------------------------------------------


@pytest.mark.usefixtures("stand_in")
def test_unpad_input_for_concatenated_sequences() -> None:
    from flash_attn.bert_padding import unpad_input_for_concatenated_sequences

    hidden = torch.arange(12.0).reshape(2, 6, 1)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    rows, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(hidden, lengths)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert cu_seqlens.tolist() == [0, 2, 5, 11]
    assert cu_seqlens.dtype == torch.int32
    assert max_seqlen == 6
    assert rows[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]


@pytest.mark.usefixtures("stand_in")
def test_index_first_axis_residual_passes_the_gradient_of_its_rows() -> None:
    from flash_attn.bert_padding import index_first_axis_residual

    x = torch.arange(8.0).reshape(4, 2).requires_grad_()
    rows, residual = index_first_axis_residual(x, torch.tensor([2, 0]))
    assert rows.tolist() == [[4.0, 5.0], [0.0, 1.0]]
    assert residual.requires_grad is False
    rows.sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
