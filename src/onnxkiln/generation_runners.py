"""The three ways `onnxkiln.generate` runs a decoder step: plain `run`, KV bindings (the
decode memo replays them), and a captured device graph replayed step after step.

Each runner takes the prompt once (`prefill`) and then one token per row per `step`, and
returns the logits of the new positions. Where the tokens sit in the cache and what the
graph's mask, position and cache-position inputs must say is the `Timeline`'s job:

- *left* rows (a graph whose attention reads the mask positionally): the prompt is padded on
  the left, every row shares one timeline of `used` positions, the mask is 0 on a row's
  leading pads, position ids count only the row's own tokens;
- *right* rows (GroupQueryAttention taking each row's length from the mask's row sum, as
  onnxruntime-genai's builder graphs do): the prompt is padded on the right and row b's
  tokens fill cache rows [0, length_b); the mask's row sums carry the lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxkiln.dtypes import from_numpy
from onnxkiln.errors import CaptureError, DeviceBindingError
from onnxkiln.generation_layout import DecoderLayout

__all__ = ["BoundRunner", "CapturedRunner", "PlainRunner", "Timeline"]


class Timeline:
    """Each row's place in the cache and the per-run inputs (mask, positions) that say it."""

    def __init__(self, layout: DecoderLayout, rows: Sequence[Sequence[int]], pad: int,
                 capacity: int) -> None:
        self.layout, self.capacity, self.pad = layout, capacity, pad
        self.rows = [np.asarray(r, np.int64) for r in rows]
        self.right = layout.shared_buffer
        self.prompt_lengths = np.array([len(r) for r in rows], np.int64)
        self.width = int(self.prompt_lengths.max())
        self.offset = np.zeros(len(rows), np.int64) if self.right else \
            self.width - self.prompt_lengths
        self.lengths = np.zeros(len(rows), np.int64)  # right rows: tokens in the cache
        self.used = 0  # positions of the shared timeline written so far
        self.mask_width = layout.static_length  # None: as wide as the used part
        self._mask_written: tuple[Any, int] | None = None

    def prompt(self) -> np.ndarray:
        """The padded prompt [batch, width]: pads on the left (left rows) or right."""
        ids = np.full((len(self.prompt_lengths), self.width), self.pad, np.int64)
        for b, n in enumerate(self.prompt_lengths):
            start = int(self.offset[b]) if not self.right else 0
            ids[b, start:start + n] = self.rows[b]
        return ids

    def advance(self, new: int, prompt: bool, mask: bool = True) -> dict[str, np.ndarray]:
        """Record `new` positions per row and return the mask/position inputs for them
        (`mask=False`: not the mask, which a binding keeps; see write_mask)."""
        lay = self.layout
        start = self.used
        self.used += new
        if self.right:
            self.lengths = self.prompt_lengths.copy() if prompt else self.lengths + new
        feeds: dict[str, np.ndarray] = {}
        if lay.attention_mask and mask:
            feeds[lay.attention_mask] = self.mask()
        if lay.position_ids:
            if self.right:
                first = self.lengths - (new if not prompt else self.prompt_lengths)
                pos = first[:, None] + np.arange(new)
            else:
                pos = np.arange(start, self.used)[None, :] - self.offset[:, None]
            feeds[lay.position_ids] = np.maximum(pos, 0).astype(np.int64)
        if lay.cache_position:
            feeds[lay.cache_position] = np.arange(start, self.used, dtype=np.int64)
        return feeds

    def mask(self, width: int | None = None) -> np.ndarray:
        """The attention mask over `width` (default: the cache's used part, or all of a fixed
        cache) for the positions recorded so far: 1 / 0, or 0 / dtype min when additive."""
        width = width or self.mask_width or self.used
        cols = np.arange(width)[None, :]
        if self.right:
            keep = cols < self.lengths[:, None]
        else:
            keep = (cols >= self.offset[:, None]) & (cols < self.used)
        dtype = np.dtype(self.layout.mask_dtype)
        if dtype.kind == "f":
            return np.where(keep, 0, np.finfo(dtype).min).astype(dtype)
        return keep.astype(dtype)

    def write_mask(self, binding: Any, new: int, prompt: bool) -> None:
        """Bring a mask binding up to date after `advance(new, prompt, mask=False)`: the
        whole mask for a prompt or a change of width; after that only the `new` columns of
        each row, which the step made visible (the rest of the mask stays as it was)."""
        width = self.mask_width or self.used
        rows = len(self.prompt_lengths)
        last = self._mask_written  # (binding, width) this timeline left it at, if any
        if (prompt or last is None or last[0] is not binding
                or binding.logical_shape != (rows, last[1]) or width - last[1] not in (0, new)):
            _put(binding, self.mask())
            self._mask_written = (binding, width)
            return
        dtype = np.dtype(self.layout.mask_dtype)
        additive = dtype.kind == "f"
        visible = np.zeros((1, new), dtype) if additive else np.ones((1, new), dtype)
        grown = last[1] != width
        if grown:
            binding.set_logical_shape((rows, width))
        self._mask_written = (binding, width)
        if not self.right:  # every row's cache ends at the shared timeline's end
            binding.write(np.repeat(visible, rows, axis=0), (0, self.used - new))
            return
        if grown:  # the new columns, hidden where a shorter row does not reach them
            hidden = np.full((rows, new), np.finfo(dtype).min if additive else 0, dtype)
            binding.write(hidden, (0, width - new))
        for r, end in enumerate(self.lengths):
            binding.write(visible, (r, int(end) - new))

    def last(self, logits: np.ndarray, prompt: bool) -> np.ndarray:
        """Each row's next-token logits [batch, vocab] from a run's logits."""
        if logits.ndim == 2:
            return logits
        if prompt and self.right:
            return logits[np.arange(len(logits)), self.lengths - 1]
        return logits[:, -1]


class PlainRunner:
    """`session.run` with the presents fed back as the next past: works on any decoder."""

    path = "plain"

    def __init__(self, session: Any, layout: DecoderLayout, timeline: Timeline) -> None:
        self.session, self.layout, self.timeline = session, layout, timeline
        self.past = layout.empty_past(len(timeline.prompt_lengths))
        self.names = [layout.logits, *layout.present]

    def run(self, ids: np.ndarray, prompt: bool) -> np.ndarray:
        feeds = {self.layout.input_ids: ids, **self.timeline.advance(ids.shape[1], prompt),
                 **self.past}
        logits, *present = self.session.run(feeds, outputs=self.names)
        self.past = dict(zip(self.layout.past, present, strict=True))
        return self.timeline.last(logits, prompt)

    def counters(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.past = {}


class BoundRunner:
    """KV entries in device bindings (past in, present written back in place); the mask in a
    binding too when it grows, so consecutive steps keep one signature and the memo replays."""

    path = "bound"

    def __init__(self, session: Any, layout: DecoderLayout, timeline: Timeline) -> None:
        self.session, self.layout, self.timeline = session, layout, timeline
        batch, cap = len(timeline.prompt_lengths), timeline.capacity
        dtype = from_numpy(np.dtype(layout.kv_dtype))
        start = layout.static_length or 0
        self.kv = [session.allocate_device_binding(p, q, dtype, layout.kv_shape(batch, cap),
                                                   layout.kv_shape(batch, start))
                   for p, q in zip(layout.past, layout.present, strict=True)]
        for b in self.kv:  # masked cache rows are still read: no stale NaN may sit there
            _zero(b)
        self.mask = None
        if layout.attention_mask and timeline.mask_width is None:
            self.mask = session.allocate_device_binding(
                layout.attention_mask, None, from_numpy(np.dtype(layout.mask_dtype)),
                (batch, cap), (batch, 0))
        self.bindings = [*self.kv, *([self.mask] if self.mask else [])]
        self.logits_index = [m.name for m in session.outputs()].index(layout.logits)
        self.memo_start = session.decode_memo_counts()

    def run(self, ids: np.ndarray, prompt: bool) -> np.ndarray:
        feeds = self._feeds(ids, prompt)
        out = self.session.run_with_device_bindings(feeds, self.bindings)
        return self.timeline.last(out[self.logits_index], prompt)

    def _feeds(self, ids: np.ndarray, prompt: bool) -> dict[str, np.ndarray]:
        """The step's unbound inputs, the mask binding brought up to date."""
        new = ids.shape[1]
        feeds = {self.layout.input_ids: ids,
                 **self.timeline.advance(new, prompt, mask=self.mask is None)}
        if self.mask is not None:
            self.timeline.write_mask(self.mask, new, prompt)
        return feeds

    def counters(self) -> dict[str, Any]:
        now = self.session.decode_memo_counts()
        names = ("memo_primed", "memo_rebuilt", "memo_replayed", "memo_ineligible")
        return {n: b - a for n, a, b in zip(names, self.memo_start, now, strict=True)}

    def close(self) -> None:
        for b in self.bindings:
            b.release()


class CapturedRunner(BoundRunner):
    """Every input and output bound; the prompt and the first step run eagerly, the second
    step is captured, later steps replay it (a retired graph is captured again; a step
    that cannot be captured runs eagerly through the same bindings, reason kept)."""

    path = "captured"
    MAX_RETIRED = 2  # consecutive retirements before giving up on replay for this loop

    def __init__(self, session: Any, layout: DecoderLayout, timeline: Timeline) -> None:
        super().__init__(session, layout, timeline)
        self.step_bindings: dict[str, Any] | None = None
        self.logits_binding = None
        self.installed = False
        self.captures = self.replays = self.retired = self.segments = 0
        self.streak = 0
        self.declined: str | None = None

    def run(self, ids: np.ndarray, prompt: bool) -> np.ndarray:
        if prompt:
            return super().run(ids, prompt)
        if self.step_bindings is None:
            self._bind_step(ids, self._eager_logits(ids, prompt))
            return self._read()
        self._write(ids)
        every = self._all()
        if self.declined is not None:
            self.session.run_with_device_bindings({}, every)
        elif self.installed:
            self.replays += 1
            if not self.session.replay_device_graph(every):
                self.installed, self.retired, self.streak = False, self.retired + 1, \
                    self.streak + 1
                if self.streak >= self.MAX_RETIRED:
                    self.declined = f"the captured step retired {self.streak} times in a row"
        else:
            self._capture(every)
        return self._read()

    def _eager_logits(self, ids: np.ndarray, prompt: bool) -> np.ndarray:
        """The first step, eagerly through the KV bindings (it also warms the plan)."""
        self._fix_cache()
        feeds = self._feeds(ids, prompt)
        out = self.session.run_with_device_bindings(feeds, self.bindings)
        self._pending = feeds
        return out[self.logits_index]

    def _fix_cache(self) -> None:
        """Right rows decode over the whole buffer: the KV bindings at full capacity and the
        mask as wide, so every shape stays the same from step to step (a whole capture)."""
        if not self.timeline.right or self.layout.static_length:
            return
        for b in self.kv:
            b.set_logical_shape(b.physical_shape)
        self.timeline.mask_width = self.timeline.capacity
        if self.mask is not None:
            self.mask.set_logical_shape(self.mask.physical_shape)

    def _bind_step(self, ids: np.ndarray, logits: np.ndarray) -> None:
        """Bindings for the per-step inputs (as fed to the first step) and the logits."""
        s, lay = self.session, self.layout
        self.step_bindings = {}
        for name, value in {lay.input_ids: ids, **self._pending}.items():
            b = s.allocate_device_binding(name, None, from_numpy(value.dtype), value.shape,
                                          value.shape)
            self.step_bindings[name] = b
        self.logits_binding = s.allocate_device_output_binding(
            lay.logits, from_numpy(logits.dtype), logits.shape, logits.shape)
        self.logits_binding.write(logits)

    def _write(self, ids: np.ndarray) -> None:
        feeds = self._feeds(ids, False)
        for name, value in feeds.items():
            self.step_bindings[name].write(value)

    def _all(self) -> list[Any]:
        return [*self.bindings, *self.step_bindings.values(), self.logits_binding]

    def _capture(self, every: list[Any]) -> None:
        try:
            result = self.session.try_capture_with_device_bindings({}, every)
        except (CaptureError, DeviceBindingError) as exc:
            self.declined = f"capture failed: {exc}"
            self.session.run_with_device_bindings({}, every)
            return
        if not result.captured:
            reasons = "; ".join(f"{d.op_type}: {d.reason}" for d in result.declines[:3])
            self.declined = f"not capturable ({reasons})"
            self.session.run_with_device_bindings({}, every)
            return
        self.installed, self.captures, self.streak = True, self.captures + 1, 0
        self.segments = result.segments

    def _read(self) -> np.ndarray:
        return self.timeline.last(self.logits_binding.read(), False)

    def counters(self) -> dict[str, Any]:
        out = super().counters()
        out.update(captures=self.captures, replays=self.replays, retired=self.retired,
                   segments=self.segments, capture_error=self.session.check_device_capture_error())
        if self.declined:
            out["capture_declined"] = self.declined
        return out

    def close(self) -> None:
        self.session.reset_device_graph()
        extra = [*(self.step_bindings or {}).values(), self.logits_binding]
        for b in extra:
            if b is not None:
                b.release()
        super().close()


def _zero(binding: Any) -> None:
    logical = binding.logical_shape
    binding.set_logical_shape(binding.physical_shape)
    binding.write(np.zeros(binding.physical_shape, binding.dtype.numpy))
    binding.set_logical_shape(logical)


def _put(binding: Any, value: np.ndarray) -> None:
    binding.set_logical_shape(value.shape)
    binding.write(value)
