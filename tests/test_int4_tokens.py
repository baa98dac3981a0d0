"""Greedy tokens of onnxruntime-genai builder int4 decoders: onnxkiln gives onnxruntime's.

The builder writes MatMulNBits at accuracy_level 4 for the CPU, where onnxruntime quantizes the
activations to int8 per block; computing those products in float32 instead made the greedy
tokens of these small random-weight models diverge after 3-7 steps. At levels 0 and 1 both
compute in float32. Builds are cached (bench/genai_models.py), so after the first run this file
takes a few seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
from bench import genai_models

from onnxkiln import InferenceSession
from onnxkiln.providers.cpu import _numba

STEPS = 32
PROMPT = [5, 6, 7]

why_not = genai_models.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))


def ort_tokens(folder) -> list[int]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(genai_models.DecoderIO(folder).model_path), so,
                                providers=["CPUExecutionProvider"])
    return genai_models.greedy(sess, folder, PROMPT, STEPS)


def first_logits(sess, folder, ort: bool) -> np.ndarray:
    """The prompt step's logits (a sharper check than tokens: a product computed at another
    precision moves them by ~1e-3 of their range, float rounding by ~1e-6)."""
    io = genai_models.DecoderIO(folder)
    feeds = io.feeds(np.asarray([PROMPT]), len(PROMPT), io.empty_past())
    return (sess.run([io.logits], feeds) if ort else sess.run(feeds))[0]


def our_tokens(folder) -> list[int]:
    path = genai_models.DecoderIO(folder).model_path
    sess = InferenceSession.builder().intra_op_threads(1).load(str(path))
    return genai_models.greedy(sess, folder, PROMPT, STEPS)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("level", [None, 0, 1])  # None: the builder's CPU default, 4
def test_int4_greedy_tokens_match_onnxruntime(arch, level, monkeypatch):
    folder = genai_models.build(arch, "int4", hidden=128, layers=2, accuracy_level=level)
    expected = ort_tokens(folder)
    assert len(set(expected)) > 3  # a sequence that says something, not one token repeated
    monkeypatch.setattr(_numba, "ENABLED", True)
    assert our_tokens(folder) == expected
    import onnxruntime as ort

    path = str(genai_models.DecoderIO(folder).model_path)
    theirs = first_logits(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), folder,
                          True)
    mine = first_logits(InferenceSession.builder().load(path), folder, False)
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=2e-5 * float(np.ptp(theirs)))
    if level is None:  # the numpy fallback of the level-4 kernel gives the same tokens
        monkeypatch.setattr(_numba, "ENABLED", False)
        assert our_tokens(folder) == expected
