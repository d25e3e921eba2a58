"""Record vLLM 0.33's own Triton unified-attention kernel with sliding windows, on CPU under
Triton's interpreter, as the fixture tests/test_kernel_window.py holds our kernel to:

    TRITON_INTERPRET=1 .venv-upstream/bin/python -m prefixcache.experiments.upstream.vllm_window_driver

On a machine without a GPU, ``vllm.triton_utils`` swaps in a placeholder Triton; the real one
is put back before the kernel module is imported.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.language.extra.libdevice as tldevice  # noqa: E402
import vllm  # noqa: E402
import vllm.triton_utils as triton_utils  # noqa: E402
from prefixcache.experiments.upstream import shim  # noqa: E402, F401  (must precede vllm)
from prefixcache.experiments.upstream.window_cases import CASES, Q_LENS, SEQ_LENS, build  # noqa: E402

triton_utils.triton, triton_utils.tl, triton_utils.tldevice = triton, tl, tldevice
triton_utils.HAS_TRITON = True
from vllm.v1.attention.ops.triton_unified_attention import unified_attention  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream"
FIXTURE = FIXTURES / "kernel" / "vllm_window.pt"


def main() -> int:
    outputs = {}
    for page_size, window in CASES:
        x = build(page_size, window)
        out = torch.empty_like(x["q"])
        head_dim = x["q"].shape[-1]
        # vLLM's window argument is (left, right): a query sees window - 1 earlier tokens
        unified_attention(x["q"], x["k"], x["v"], out, x["cu_seqlens_q"], max(Q_LENS), x["seq_lens"],
                          max(SEQ_LENS), head_dim**-0.5, True, (window - 1, 0), x["page_table"], 0,
                          None, None, None)
        outputs[f"{page_size}-{window}"] = out.to(torch.float16)
    torch.save({"vllm": vllm.__version__, "outputs": outputs}, FIXTURE)
    print(f"{len(outputs)} cases -> {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
