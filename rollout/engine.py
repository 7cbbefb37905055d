"""One generation engine per worker or server, shared by every in-flight episode.

Turns are submitted as ``EngineRequest`` s (prompt token ids + per-request
sampling) from any thread or event loop; one engine thread admits them into
free slots of a preallocated KV cache (``rollout.engine_model.SlotModel``),
prefills the newcomers together (right-padded, in length-sorted chunks) and
decodes every running request one token per step in one batch (continuous
batching: a finished request frees its slot at once, a new one joins at the
next step). On CUDA the decode step replays a CUDA graph per (batch, length)
bucket, and runs ``decode_steps`` (8) steps per replay, sampling on the device
from each request's pre-drawn uniforms, before the host looks once: the host
then takes each request's tokens one by one under the same rules as a single
step and drops those past a stop (``_multi_step``). While a request feeds a
budget's close tag the engine goes one step at a time. A request that arrives while the engine is idle opens an
admission window: the engine waits until no request has arrived for ``admission_window_s`` (2 ms on CUDA, none on
CPU; at most 10 such windows in all), so a burst of turns submitted one by one is prefilled together; later ones
join the running batch at the next step. Requests admitted together with the same prompt ids (a GRPO group's
first turn, a tree's leaves at their branch point) are prefilled once: one of them is computed, the others copy
its keys and values into their slots (``SlotModel.copy_prefix``) and sample their first token from its logits,
each with its own uniforms (``share_prompts``, on CUDA by default; ``shared_prefills`` counts the copies).
With the split-K attention the copies' decode steps also read the prompt from the slot it was copied from, one
copy for the group (``shared_reads``), until that slot's request ends.

**What a request gets back** (``EngineOutput``): the token ids, each one's
logprob (``rollout.engine_sampling``: fp32 log-softmax at the request's
temperature, before top-p), a sampled mask (0 for the close tag a thinking
budget inserted), the weight version of every token, and why it stopped.
Stopping and the thinking budget follow ``HFPolicy``'s rules exactly: a stop
token is kept, a stop string ends the turn at the token that completes it,
the budget's close tag is fed through the model one token per step.

**Reproducible per request.** A request's randomness is its own: ``seed``
seeds a generator that draws its uniforms up front, and each token is the
inverse CDF at the next uniform. The same request samples the same tokens
alone or in any batch (up to floating-point differences between batch shapes,
which move a token only when a uniform falls within ~1e-7 of a CDF boundary).

**Weights** (``update_weights(state, version, mode=...)``): copied in place
(``copy_``: the cache and any captured graph stay valid) between steps.
``mode="wait"`` (the default, ``HFPolicy``'s contract): admission stops, the
requests in flight finish on the old weights, then the copy, then admission
resumes, so every request sees one version. ``mode="keep"``: the running
requests are held at the next step boundary, the weights are swapped, and they
resume on the new ones; their tokens' versions split at the update (the keys
and values already cached stay the old weights', as in vLLM's ``keep``).
Both take ``timeout_s`` and raise ``EngineTimeout`` with nothing changed.
``pause(mode)`` / ``resume()`` / ``is_paused`` are vLLM's ``/pause?mode=
abort|wait|keep`` semantics for a server.

>>> engine = Engine(model, tokenizer)                                         # doctest: +SKIP
>>> out = engine.generate_sync(EngineRequest(prompt_ids=ids, max_new_tokens=64, seed=1))
>>> out.token_ids, out.logprobs, out.versions
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from rollout.engine_model import MAX_STEPS, SlotModel, supports
from rollout.engine_sampling import sample_rows, uniforms
from rollout.policy.types import FinishReason, ThinkingBudget

PauseMode = Literal["abort", "wait", "keep"]


class EngineError(RuntimeError):
    """The engine could not produce a request's output (a failed step, a closed engine)."""


class EngineRequestError(EngineError, ValueError):
    """A malformed request; the message names the field and what was expected."""


class EngineTimeout(EngineError, TimeoutError):
    """A weight update or pause that could not complete within its timeout; nothing was changed."""


class EngineClosed(EngineError):
    """The engine was closed with the request unfinished."""


@dataclass(frozen=True)
class EngineRequest:
    """One turn to generate. ``seed`` seeds the request's own generator (None: nondeterministic)."""

    prompt_ids: Sequence[int]
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    budget: ThinkingBudget | None = None
    request_id: str = ""


@dataclass(frozen=True)
class EngineOutput:
    """What a request produced. All per-token tuples have ``len(token_ids)`` entries."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    sampled_mask: tuple[int, ...]
    versions: tuple[int, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    thinking_tokens: int = 0
    budget_closed: bool = False
    queued_s: float = 0.0


@dataclass
class _Spec:
    """A multi-step call started before the host took the previous one's tokens (``Engine(overlap=True)``)."""

    tokens: torch.Tensor  # [steps, batch] on the device
    logps: torch.Tensor
    steps: int
    version: int
    rows: list[tuple[_Live, int, int]]  # each row, the position it must reach and the token it must feed
    batch: int
    length: int


@dataclass
class _Live:
    """A request in a slot: what it has produced and what it feeds next."""

    req: EngineRequest
    fut: Future[EngineOutput]
    ids: list[int]
    u: list[float]
    submitted: float
    slot: int = -1
    pos: int = 0  # the next cache position to write (= tokens in the slot)
    feed: list[int] = field(default_factory=list)  # tokens to feed before the next logits are used
    out: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    sampled: int = 0
    thinking: int = 0
    inside: bool = False
    closed: bool = False
    text: str = ""
    tail: str = ""
    close_ids: list[int] = field(default_factory=list)
    finish: FinishReason | None = None


def _bucket(n: int, sizes: Sequence[int]) -> int:
    return next((s for s in sizes if s >= n), n)


class Engine:
    """The batching engine; see the module docstring.

    ``model``: a supported causal LM (``rollout.engine_model.supports``), already
    on its device and dtype. ``tokenizer``: needed only for stop strings and
    thinking budgets (requests using them fail without one). ``max_slots`` /
    ``max_len``: the most requests decoded at once and the longest prompt +
    completion; the cache grows to them as needed (``reserve`` preallocates).
    ``cuda_graphs``: None = on for CUDA models. ``decode_steps``: decode steps run on the device between two
    looks by the host (``SlotModel.decode_sample``; None = 8 with CUDA graphs, else 1: on CPU the host is not
    what a step waits on, and one step at a time keeps the CPU runs' numbers as they were). ``fuse``: the fused
    pointwise kernels of ``SlotModel`` (None = on CUDA). ``attention``: the decode attention, ``"triton"`` (the
    split-K kernels of ``rollout.engine_attention``) or ``"sdpa"`` (None = Triton on CUDA with a 16-bit model).
    ``sampler``: multi-step decode's sampling, ``"triton"`` (``rollout.engine_sampling.sample_fused`` where no row
    has ``top_p < 1``) or ``"torch"`` (``sample_static``; None = Triton on CUDA). ``pack``: with ``fuse``, each
    layer's q/k/v and gate/up projections as one GEMM each, the modules' weights made views of the packed tensors
    (``SlotModel``; None = on CUDA). ``rope_in_attention``: the split-K kernels apply the rotary embedding
    themselves (``SlotModel``; off by default, opt-in until measured alone on a GPU). ``merge_in_split``: the split
    kernel's last chunk merges a row's chunks, no merge kernel (``SlotModel``; off by default). ``share_prompts``:
    requests admitted together with one prompt are prefilled once (module docstring; None = on CUDA).
    ``shared_reads``: with the split-K kernels, the copies of a shared prompt read it from the slot it was copied
    from (``SlotModel``; None = on with those kernels). ``overlap``: with ``decode_steps`` > 1, the next multi-step
    call starts on the device, each row feeding its last sampled token, before the host takes the current call's
    tokens, and is kept for the rows that went on (``_drain``): the host's work hides behind the device's (None = on
    with CUDA graphs and ``decode_steps`` > 1; on CPU the host's work is not what a step waits on).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_slots: int = 256,
        max_len: int | None = None,
        admission_window_s: float | None = None,
        prefill_tokens: int | None = None,
        cuda_graphs: bool | None = None,
        version: int = 0,
        name: str = "engine",
        tokenizer_lock: threading.Lock | None = None,
        eot_id: int | None = None,
        decode_steps: int | None = None,
        fuse: bool | None = None,
        attention: str | None = None,
        sampler: str | None = None,
        pack: bool | None = None,
        rope_in_attention: bool = False,
        merge_in_split: bool = False,
        share_prompts: bool | None = None,
        shared_reads: bool | None = None,
        overlap: bool | None = None,
    ) -> None:
        if not supports(model):
            raise EngineRequestError(f"{name}: model_type {getattr(model.config, 'model_type', None)!r} is not supported")
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self._tok_lock = tokenizer_lock or threading.Lock()
        self.eot_id = eot_id  # a thinking budget reads the prompt's text after the last one (the turn so far)
        device = next(model.parameters()).device
        self.max_slots = int(max_slots)
        self.max_len = int(max_len or min(int(getattr(model.config, "max_position_embeddings", 4096)), 32768))
        cuda = device.type == "cuda"
        # On CUDA a burst of turns is worth one prefill batch; on CPU a turn is short and the window would be its cost.
        self.admission_window_s = float(admission_window_s if admission_window_s is not None else (0.002 if cuda else 0.0))
        self.prefill_tokens = int(prefill_tokens or (32768 if cuda else 4096))
        # On CPU turns seldom meet in one admission (no window), and off keeps the CPU runs' numbers as they were.
        self.share_prompts = cuda if share_prompts is None else bool(share_prompts)
        graphs = cuda if cuda_graphs is None else bool(cuda_graphs) and cuda
        # On CUDA the decode batch and attended length are rounded up to buckets (one graph each); on CPU exact.
        sizes = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 144, 160, 192, 224, 256, 320, 384, 448, 512) if cuda else ()
        self.slot_sizes = tuple(s for s in sizes if s < self.max_slots) + ((self.max_slots,) if cuda else ())
        self.len_step = 256 if cuda else 1
        self._cap_len = -(-self.max_len // self.len_step) * self.len_step  # the cache's longest (aligned) length
        self.slots = SlotModel(
            model, slots=min(8, self.max_slots), length=min(512 if cuda else 64, self.max_len), graphs=graphs, fuse=fuse,
            attention=attention, sampler=sampler, pack=pack, rope_in_attention=rope_in_attention,
            merge_in_split=merge_in_split, shared_reads=shared_reads,
        )
        steps = decode_steps if decode_steps is not None else (8 if graphs else 1)
        if not 1 <= steps <= MAX_STEPS:
            raise EngineRequestError(f"{name}: decode_steps must be in [1, {MAX_STEPS}], got {steps}")
        self.decode_steps = int(steps)
        self.overlap = (graphs and steps > 1) if overlap is None else bool(overlap)
        self._spec: _Spec | None = None  # the call started ahead of the host (``overlap``)
        self._version = int(version)
        self._cond = threading.Condition()
        self._step = threading.Lock()  # held for every forward; a weight copy takes it between steps
        self._waiting: collections.deque[_Live] = collections.deque()
        self._running: dict[int, _Live] = {}
        self._free: list[int] = []
        self._draining = 0  # wait-mode updates / pauses in progress: no admission
        self._held = False  # keep: no steps
        self._paused: PauseMode | None = None
        self._closed = False
        self._sleeping = 0
        self._ids = itertools.count()
        self.steps = 0  # decode steps run
        self.syncs = 0  # decode calls the host waited on (one per step, or per ``decode_steps`` steps)
        self.tokens_out = 0
        self.overlapped = 0  # calls started ahead of the host (``overlap``) whose tokens were kept
        # Wall seconds of the engine thread by phase (benches read them): prefilling newcomers (and sampling their
        # first token), waiting on decode calls (launch to the host's copy of the tokens), and the host's own work
        # around them (building a call's inputs, taking its tokens under the stop rules).
        self.phase_s = {"prefill": 0.0, "decode": 0.0, "host": 0.0}
        self.prefills = 0  # prefill forwards run (a burst admitted together is one per length-sorted chunk)
        self.shared_prefills = 0  # requests whose prompt was not computed: copied from an identical one's cache
        self.admissions: collections.deque[int] = collections.deque(maxlen=1024)  # latest admissions' sizes (benches)
        self._arrived = 0.0  # monotonic time of the latest submit (the admission window waits for a quiet gap)
        self._thread = threading.Thread(target=self._loop, name=f"{name}-loop", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ public API

    @property
    def version(self) -> int:
        return self._version

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def is_paused(self) -> bool:
        return self._paused is not None

    @property
    def paused_mode(self) -> PauseMode | None:
        """The mode of the pause in force (``pause``), None when generating."""
        return self._paused

    def reserve(self, slots: int, length: int) -> None:
        """Preallocate the cache for ``slots`` requests of ``length`` tokens (no growth, no recapture later)."""
        with self._step:
            self.slots.ensure(min(slots, self.max_slots), min(-(-length // self.len_step) * self.len_step, self._cap_len))

    def submit(self, request: EngineRequest) -> Future[EngineOutput]:
        """Queue ``request``; the future resolves to its ``EngineOutput``. Malformed: ``EngineRequestError`` at once."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[EngineRequest]) -> list[Future[EngineOutput]]:
        """Queue ``requests`` at once: the engine sees all of them or none (a burst submitted one by one can be
        split by the admission window, by a pause of the submitting thread longer than the window, and then admitted
        in two parts). A malformed one raises ``EngineRequestError`` naming its index, and none is queued."""
        lives: list[_Live] = []
        for i, request in enumerate(requests):
            try:
                self._validate(request)
            except EngineRequestError as exc:
                raise EngineRequestError(f"{exc} (request {i} of {len(requests)}; none was queued)"
                                         if len(requests) > 1 else str(exc)) from exc
            fut: Future[EngineOutput] = Future()
            if not request.request_id:
                request = replace(request, request_id=f"req-{next(self._ids)}")
            u = uniforms(request.seed, request.max_new_tokens).tolist()
            lives.append(_Live(request, fut, [int(t) for t in request.prompt_ids], u, time.monotonic()))
        with self._cond:
            if self._closed:
                raise EngineClosed(f"{self.name}: closed")
            self._waiting.extend(lives)
            self._arrived = time.monotonic()
            self._cond.notify_all()
        return [live.fut for live in lives]

    async def generate(self, request: EngineRequest) -> EngineOutput:
        """``submit`` awaited on the caller's event loop (cancelling it frees the request's slot)."""
        return await asyncio.wrap_future(self.submit(request))

    def generate_sync(self, request: EngineRequest, timeout_s: float | None = None) -> EngineOutput:
        return self.submit(request).result(timeout_s)

    def update_weights(
        self, state: Mapping[str, torch.Tensor], version: int, *, mode: Literal["wait", "keep"] = "wait", timeout_s: float = 600.0
    ) -> None:
        """Copy ``state`` into the model in place and set ``version``; see the module docstring for ``mode``."""
        if mode not in ("wait", "keep"):
            raise EngineRequestError(f"{self.name}: update_weights mode must be 'wait' or 'keep', got {mode!r}")
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if mode == "wait":
                self._draining += 1
            else:
                self._held = True
            self._cond.notify_all()
            try:
                while mode == "wait" and self._running:
                    if not self._cond.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                        raise EngineTimeout(
                            f"{self.name}: weights version {version} not loaded: {len(self._running)} requests still "
                            f"running after {timeout_s}s (mode 'wait')"
                        )
            except BaseException:
                self._draining -= 1
                self._cond.notify_all()
                raise
        try:
            if not self._step.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise EngineTimeout(f"{self.name}: weights version {version} not loaded: a step outlasted {timeout_s}s")
            try:
                with torch.no_grad():
                    self.model.load_state_dict(dict(state), strict=True)
                self._version = int(version)
            finally:
                self._step.release()
        finally:
            with self._cond:
                if mode == "wait":
                    self._draining -= 1
                else:
                    self._held = self._paused == "keep"
                self._cond.notify_all()

    def pause(self, mode: PauseMode = "abort", timeout_s: float = 600.0) -> None:
        """Stop generating (vLLM's ``/pause``): ``abort`` ends every request now (finish reason ``abort``, the
        tokens so far returned); ``wait`` stops admission and returns once the running requests finished; ``keep``
        freezes the running requests in their slots until ``resume``."""
        if mode not in ("abort", "wait", "keep"):
            raise EngineRequestError(f"{self.name}: pause mode must be 'abort', 'wait' or 'keep', got {mode!r}")
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._paused = mode
            self._held = mode == "keep"
            self._cond.notify_all()
            if mode == "wait":
                while self._running:
                    if not self._cond.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                        raise EngineTimeout(f"{self.name}: {len(self._running)} requests still running after {timeout_s}s")
        if mode == "abort":
            with self._step:
                with self._cond:
                    victims = list(self._running.values()) + list(self._waiting)
                    self._waiting.clear()
                for live in victims:
                    live.finish = FinishReason.ABORT
                    self._complete(live)
        elif mode == "keep":
            self._step.acquire(timeout=max(0.0, deadline - time.monotonic()))  # the step in flight has ended
            self._step.release()

    @property
    def sleeping(self) -> int:
        """The sleep level in force (``sleep``), 0 when awake."""
        return self._sleeping

    def sleep(self, level: int = 1, timeout_s: float = 600.0) -> None:
        """vLLM's ``/sleep``: finish the requests in flight (``pause("wait")``), free the KV cache and the CUDA
        graphs and, on a GPU, move the weights to host memory. Level 2 does the same here (the weights are kept,
        on the host, rather than discarded). Requests submitted meanwhile wait for ``wake_up``."""
        if level not in (1, 2):
            raise EngineRequestError(f"{self.name}: sleep level must be 1 or 2, got {level!r}")
        self.pause("wait", timeout_s)
        with self._step:
            self.slots.release()
            if self.slots.device.type == "cuda":
                self.model.to("cpu")  # in place (param.data): the engine's module references stay valid
                torch.cuda.empty_cache()
            self._sleeping = level

    def wake_up(self) -> None:
        """vLLM's ``/wake_up``: weights back on the device, the cache allocated again as requests need it."""
        with self._step:
            if self._sleeping and self.slots.device.type == "cuda":
                self.model.to(self.slots.device)
            self._sleeping = 0
        self.resume()

    def resume(self) -> None:
        if self._sleeping:
            raise EngineRequestError(f"{self.name}: asleep (level {self._sleeping}); wake_up resumes it")
        with self._cond:
            self._paused = None
            self._held = False
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the engine thread; unfinished requests fail with ``EngineClosed``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        for live in list(self._running.values()) + list(self._waiting):
            if not live.fut.done():
                live.fut.set_exception(EngineClosed(f"{self.name}: closed before request {live.req.request_id} finished"))

    # ------------------------------------------------------------ validation

    def _validate(self, r: EngineRequest) -> None:
        where = f"{self.name}: request {r.request_id or '(new)'}"
        if not r.prompt_ids:
            raise EngineRequestError(f"{where}: prompt_ids is empty (a prompt needs at least one token)")
        bad = next((t for t in r.prompt_ids if not isinstance(t, int) or not 0 <= int(t) < self.slots.vocab), None)
        if bad is not None or any(not isinstance(t, int) for t in r.prompt_ids):
            raise EngineRequestError(f"{where}: prompt_ids holds {bad!r}, expected token ids in [0, {self.slots.vocab})")
        if not isinstance(r.max_new_tokens, int) or r.max_new_tokens < 0:
            raise EngineRequestError(f"{where}: max_new_tokens must be an int >= 0, got {r.max_new_tokens!r}")
        if len(r.prompt_ids) + r.max_new_tokens > self.max_len:
            raise EngineRequestError(
                f"{where}: prompt_ids ({len(r.prompt_ids)} tokens) + max_new_tokens ({r.max_new_tokens}) exceeds "
                f"the engine's max_len {self.max_len}"
            )
        if not r.temperature >= 0:
            raise EngineRequestError(f"{where}: temperature must be >= 0, got {r.temperature}")
        if not 0 < r.top_p <= 1:
            raise EngineRequestError(f"{where}: top_p must be in (0, 1], got {r.top_p}")
        if (r.stop or r.budget is not None) and self.tokenizer is None:
            raise EngineRequestError(f"{where}: stop strings and thinking budgets need an engine built with a tokenizer")
        if r.budget is not None and r.budget.max_thinking_tokens < 0:
            raise EngineRequestError(f"{where}: budget.max_thinking_tokens must be >= 0, got {r.budget.max_thinking_tokens}")

    # ------------------------------------------------------------ text helpers (stop strings, budget)

    def _decode(self, ids: Sequence[int]) -> str:
        with self._tok_lock:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def _start_text(self, live: _Live) -> None:
        b = live.req.budget
        if b is None:
            return
        last = max((i for i, t in enumerate(live.ids) if t == self.eot_id), default=-1)
        live.tail = self._decode(live.ids[last + 1 :])
        live.inside = live.tail.rfind(b.open_tag) > live.tail.rfind(b.close_tag)
        with self._tok_lock:
            live.close_ids = list(self.tokenizer.encode(b.close_tag, add_special_tokens=False))

    # ------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._has_work():
                    self._cond.wait()
                if self._closed:
                    return
                if not self._running and self.admission_window_s > 0:  # idle: let a burst gather
                    self._gather()
                admitted = self._admit()
                if admitted:
                    self.admissions.append(len(admitted))
            try:
                with self._step:
                    self._iteration(admitted)
            except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, never the engine
                self._spec = None
                for live in admitted + list(self._running.values()):
                    if live.finish is None:
                        live.finish = FinishReason.STOP
                        self._release(live)
                        if not live.fut.done():
                            live.fut.set_exception(EngineError(f"{self.name}: generation failed ({type(exc).__name__}: {exc})"))

    def _gather(self) -> None:
        """Wait (holding ``_cond``'s wait) until no request has arrived for ``admission_window_s``, at most 10 windows:
        a submit's notify must not end the window, or a burst is prefilled a request or two at a time."""
        window = self.admission_window_s
        cap = time.monotonic() + 10 * window
        while not self._closed:
            now = time.monotonic()
            until = min(self._arrived + window, cap)
            if now >= until:
                return
            self._cond.wait(until - now)

    def _has_work(self) -> bool:
        if self._held or self._paused == "abort":  # abort: no step more (the loop would win the step lock back)
            return False
        can_admit = self._waiting and not self._draining and self._paused is None
        return bool(can_admit or self._running)

    def _admit(self) -> list[_Live]:
        """Move waiting requests into free slots (under ``_cond``)."""
        admitted: list[_Live] = []
        if self._draining or self._paused is not None:
            return admitted
        while self._waiting and len(self._running) + len(admitted) < self.max_slots:
            live = self._waiting.popleft()
            if live.fut.cancelled():
                continue
            admitted.append(live)
        return admitted

    def _slot(self) -> int:
        if self._free:
            self._free.sort()
            return self._free.pop(0)
        return len(self._running) + len(self._free)

    def _iteration(self, admitted: list[_Live]) -> None:
        self._drain(chain=not admitted)  # a speculative call in flight (``overlap``): its tokens first
        if self._spec is not None:  # the drain started the call after it: nothing else steps until it is taken
            return
        fresh: list[_Live] = []
        for live in admitted:
            if live.req.max_new_tokens == 0:
                live.finish = FinishReason.LENGTH
                self._complete(live)
                continue
            live.slot = self._slot()
            with self._cond:
                self._running[live.slot] = live
            self._start_text(live)
            fresh.append(live)
        if fresh:
            t_prefill = time.perf_counter()
            need = max(self._running) + 1
            longest = max(len(lv.ids) + lv.req.max_new_tokens for lv in fresh)
            length = 1 << max(longest - 1, 1).bit_length() if self.len_step > 1 else longest
            have = self.slots
            if need > have.slots:  # grow geometrically: a reallocation copies the cache (and drops CUDA graphs)
                need = max(_bucket(need, self.slot_sizes), min(2 * have.slots, self.max_slots))
            if length > have.length:
                length = max(length, min(2 * have.length, self._cap_len))
            self.slots.ensure(min(need, self.max_slots), min(length, self._cap_len))
            fresh.sort(key=lambda lv: len(lv.ids))
            # Requests with one prompt (a GRPO group's first turn, a tree's leaves at their branch point) are
            # prefilled once: the first of them is computed, the others copy its cache and share its logits.
            copies: dict[int, list[_Live]] = {}
            if self.share_prompts:
                first: dict[tuple[int, ...], _Live] = {}
                for live in fresh:
                    rep = first.setdefault(tuple(live.ids), live)
                    if rep is not live:
                        copies.setdefault(id(rep), []).append(live)
                fresh = [lv for lv in fresh if first[tuple(lv.ids)] is lv]
            chunks: list[list[_Live]] = [[]]
            for live in fresh:  # length-sorted chunks of at most prefill_tokens padded tokens
                if chunks[-1] and (len(chunks[-1]) + 1) * len(live.ids) > self.prefill_tokens:
                    chunks.append([])
                chunks[-1].append(live)
            for chunk in chunks:
                logits_NV = self.slots.prefill([lv.slot for lv in chunk], [lv.ids for lv in chunk])
                self.prefills += 1
                admitted_now, row_of = list(chunk), list(range(len(chunk)))
                for i, lv in enumerate(chunk):
                    same = copies.get(id(lv), [])
                    if same:
                        self.slots.copy_prefix(lv.slot, [c.slot for c in same], len(lv.ids))
                        self.shared_prefills += len(same)
                        admitted_now += same
                        row_of += [i] * len(same)
                for lv in admitted_now:
                    lv.pos = len(lv.ids)
                if len(admitted_now) > len(chunk):
                    logits_NV = logits_NV.index_select(0, torch.tensor(row_of, device=logits_NV.device))
                self._use(admitted_now, logits_NV)
            self.phase_s["prefill"] += time.perf_counter() - t_prefill
        stepping = sorted((lv for lv in self._running.values() if lv.finish is None and lv.feed), key=lambda lv: lv.slot)
        if not stepping or self._held:
            return
        top = stepping[-1].slot + 1
        batch = min(_bucket(top, self.slot_sizes), self.slots.slots)
        longest = max(lv.pos for lv in stepping) + 1
        steps = self._steps_for(stepping, longest)
        if steps > 1:
            self._multi_step(stepping, top, batch, longest, steps)
            return
        t0 = time.perf_counter()
        length = self._length(longest)
        tokens, pos = [0] * top, [0] * top
        for lv in stepping:
            tokens[lv.slot] = lv.feed.pop(0)
            pos[lv.slot] = lv.pos
            lv.pos += 1
        t1 = time.perf_counter()
        logits_BV = self.slots.decode(tokens, pos, batch, length)
        self.steps += 1
        self.syncs += 1
        ready = [lv for lv in stepping if not lv.feed]
        if ready:
            rows = torch.tensor([lv.slot for lv in ready], device=logits_BV.device)
            self._use(ready, logits_BV.index_select(0, rows))  # samples and syncs: counted as the decode's wait
        t2 = time.perf_counter()
        self.phase_s["host"] += t1 - t0
        self.phase_s["decode"] += t2 - t1

    def _steps_for(self, stepping: list[_Live], longest: int) -> int:
        """How many decode steps the next call may run before the host looks (1: one step, as always).

        Several only when every row feeds exactly one token (none is feeding a budget's close tag), and no more
        than the longest remaining turn needs or the cache holds; a power of two, so few graphs are captured."""
        if self.decode_steps <= 1 or any(len(lv.feed) != 1 for lv in stepping):
            return 1
        left = max(lv.req.max_new_tokens - len(lv.out) for lv in stepping)
        room = self.slots.length - longest + 1
        cap = min(self.decode_steps, left, room)
        return 1 << (cap.bit_length() - 1) if cap >= 1 else 1

    def _multi_step(self, stepping: list[_Live], top: int, batch: int, longest: int, steps: int) -> None:
        """``steps`` decode steps with sampling on the device, then every row's tokens taken one at a time exactly
        as ``_use`` takes a sampled token: a row that stops (or whose budget closes) mid-way keeps the tokens up to
        that point and the rest are dropped (their cache entries lie past its position: masked, then overwritten)."""
        t0 = time.perf_counter()
        length = self._length(longest + steps - 1)
        tokens, pos = [0] * top, [0] * top
        temp, top_p = [0.0] * top, [1.0] * top
        for lv in stepping:
            tokens[lv.slot], pos[lv.slot] = lv.feed[0], lv.pos
            temp[lv.slot], top_p[lv.slot] = lv.req.temperature, lv.req.top_p
        u_KN = self._uniforms(stepping, top, steps, 0)
        t1 = time.perf_counter()
        token_KB, logp_KB = self.slots.decode_sample(tokens, pos, batch, length, steps, temp, top_p, u_KN)
        tokens_BK, logps_BK = token_KB.T.tolist(), logp_KB.T.tolist()  # the one host sync of these steps; a row a slot
        t2 = time.perf_counter()
        self.steps += steps
        self.syncs += 1
        version = self._version
        if self.overlap:  # the next call starts on the device while the host takes these tokens
            self._speculate(stepping, longest, length, steps, batch, token_KB[-1], tokens_BK)
        for lv in stepping:
            self._take(lv, tokens_BK[lv.slot], logps_BK[lv.slot], steps, version)
        self.phase_s["host"] += (t1 - t0) + (time.perf_counter() - t2)
        self.phase_s["decode"] += t2 - t1

    def _length(self, positions: int) -> int:
        """The cache length a call over ``positions`` positions attends to: aligned to ``len_step``, at most the cache's."""
        return min(-(-positions // self.len_step) * self.len_step, self.slots.length)

    def _speculate(self, rows: list[_Live], longest: int, length: int, steps: int, batch: int, last_B: torch.Tensor,
                   tokens_BK: list[list[int]]) -> None:
        """Start the ``steps`` steps after a call of ``length`` (whose tokens the host has not taken yet) when
        ``_may_speculate`` allows: each row feeds that call's last sampled token ``last_B`` (on the device) at its
        position + ``steps``, with its next uniforms; ``_drain`` keeps the results for the rows that took all of
        that call's tokens and go on."""
        length_next = self._length(longest + 2 * steps - 1)
        if not self._may_speculate(rows, longest, length, length_next, steps):
            return
        top = max(lv.slot for lv in rows) + 1
        nxt = self.slots.decode_sample_next(batch, length_next, steps, self._uniforms(rows, top, steps, steps), last_B)
        self._spec = _Spec(nxt[0], nxt[1], steps, self._version,
                           [(lv, lv.pos + steps, tokens_BK[lv.slot][-1]) for lv in rows], batch, length_next)

    @staticmethod
    def _uniforms(stepping: list[_Live], top: int, steps: int, skip: int) -> list[list[float]]:
        """``u_KN`` of a multi-step call: row ``slot``'s uniforms for its next ``steps`` samples after ``skip`` more
        (0 past its last, an idle row all 0)."""
        u_BK = [[0.0] * steps for _ in range(top)]
        for lv in stepping:
            u = lv.u[lv.sampled + skip : lv.sampled + skip + steps]
            u_BK[lv.slot][: len(u)] = u
        return [list(col) for col in zip(*u_BK, strict=True)]

    def _take(self, lv: _Live, row_t: list[int], row_l: list[float], steps: int, version: int) -> None:
        """A row's tokens of a multi-step call, taken one at a time under the single-step rules."""
        if lv.fut.cancelled():
            lv.finish = FinishReason.ABORT
            self._release(lv)
            return
        if lv.req.budget is None and not lv.req.stop:  # no text to watch: the row's tokens taken in one go
            self._accept_run(lv, row_t, row_l, version)
            return
        for k in range(steps):
            lv.feed = []
            lv.pos += 1
            if self._force_close(lv, version) or not self._accept(lv, row_t[k], row_l[k], version):
                break

    def _may_speculate(self, stepping: list[_Live], longest: int, length: int, length_next: int, steps: int) -> bool:
        """Whether the next call can start before the host has taken this one's tokens: some row has tokens left
        after this call, nothing waits to be admitted, no pause or update is pending, the next ``steps`` positions
        of every row fit the cache and, with CUDA graphs, the same length bucket (so the same graph replays)."""
        return (steps > 1 and not self._waiting and not self._draining and self._paused is None and not self._held
                and longest - 1 + 2 * steps <= length_next and (length_next == length or not self.slots.graphs)
                and any(len(lv.out) + steps < lv.req.max_new_tokens for lv in stepping))

    def _drain(self, chain: bool = False) -> None:
        """Take the speculative call's tokens (``overlap``) for every row that took all of the call before it
        (same position and last token as assumed, still running); the other rows' results are dropped (their
        cache entries lie past their positions: masked, then overwritten), and they go on from where they are.

        ``chain`` (nothing was admitted this iteration): when every row is still valid and the call after it may
        start (``_may_speculate``), it is started before the host takes these tokens, so a wave's calls run back to
        back on the device and the host's look hides behind each of them, not every other one."""
        spec, self._spec = self._spec, None
        if spec is None:
            return
        valid = [lv for lv, pos, last in spec.rows
                 if lv.finish is None and self._running.get(lv.slot) is lv and lv.pos == pos and lv.feed == [last]]
        if not valid:
            return
        t0 = time.perf_counter()
        tokens_BK, logps_BK = spec.tokens.T.tolist(), spec.logps.T.tolist()
        t1 = time.perf_counter()
        self.steps += spec.steps
        self.syncs += 1
        self.overlapped += 1
        if chain and len(valid) == len(spec.rows) == sum(lv.finish is None for lv in self._running.values()):
            self._speculate(valid, max(lv.pos for lv in valid) + 1, spec.length, spec.steps, spec.batch, spec.tokens[-1],
                            tokens_BK)
        for lv in valid:
            self._take(lv, tokens_BK[lv.slot], logps_BK[lv.slot], spec.steps, spec.version)
        self.phase_s["decode"] += t1 - t0
        self.phase_s["host"] += time.perf_counter() - t1

    def _use(self, ready: list[_Live], logits_NV: torch.Tensor) -> None:
        """Sample (or insert the budget's close tag) for every request of ``ready`` (row i of ``logits_NV``)."""
        version = self._version
        sample: list[_Live] = []
        rows: list[int] = []
        for i, lv in enumerate(ready):
            if lv.fut.cancelled():
                lv.finish = FinishReason.ABORT
                self._release(lv)
                continue
            if self._force_close(lv, version):
                continue
            sample.append(lv)
            rows.append(i)
        if not sample:
            return
        if len(rows) < logits_NV.shape[0]:
            logits_NV = logits_NV.index_select(0, torch.tensor(rows, device=logits_NV.device))
        temp_N = torch.tensor([lv.req.temperature for lv in sample], dtype=torch.float32)
        top_p_N = torch.tensor([lv.req.top_p for lv in sample], dtype=torch.float32)
        u_N = torch.tensor([lv.u[lv.sampled] for lv in sample], dtype=torch.float64)
        token_N, logp_N = sample_rows(logits_NV, temp_N, top_p_N, u_N)
        for lv, token, logp in zip(sample, token_N.tolist(), logp_N.tolist()):
            self._accept(lv, token, logp, version)

    def _force_close(self, lv: _Live, version: int) -> bool:
        """The thinking budget is spent: the close tag is the next tokens (fed one a step), not a sample."""
        b = lv.req.budget
        if b is None or not lv.inside or lv.thinking < b.max_thinking_tokens:
            return False
        forced = lv.close_ids[: lv.req.max_new_tokens - len(lv.out)]
        lv.out += forced
        lv.mask += [0] * len(forced)
        lv.logps += [0.0] * len(forced)
        lv.versions += [version] * len(forced)
        lv.closed, lv.inside = True, False
        if len(lv.out) >= lv.req.max_new_tokens:
            lv.finish = FinishReason.BUDGET
            self._complete(lv)
            return True
        lv.text = self._decode(lv.out)
        lv.feed = list(forced)
        return True

    def _accept(self, lv: _Live, token: int, logp: float, version: int) -> bool:
        """Append a sampled token and apply the stop rules; whether the request goes on (its ``feed`` is the token)."""
        lv.out.append(token)
        lv.mask.append(1)
        lv.logps.append(logp)
        lv.versions.append(version)
        lv.sampled += 1
        lv.thinking += int(lv.inside)
        self.tokens_out += 1
        req = lv.req
        if token in req.stop_token_ids:
            lv.finish = FinishReason.STOP
        elif req.stop or req.budget is not None:
            before = len(lv.text)
            lv.text = self._decode(lv.out)
            longest = max((len(s) for s in req.stop if s), default=0)
            window = lv.text[max(0, before - longest) :]
            if any(s and s in window for s in req.stop):
                lv.finish = FinishReason.STOP
            elif req.budget is not None:
                full = lv.tail + lv.text
                lv.inside = full.rfind(req.budget.open_tag) > full.rfind(req.budget.close_tag)
        if lv.finish is None and len(lv.out) >= req.max_new_tokens:
            lv.finish = FinishReason.LENGTH
        if lv.finish is not None:
            self._complete(lv)
            return False
        lv.feed = [token]
        return True

    def _accept_run(self, lv: _Live, tokens: list[int], logps: list[float], version: int) -> None:
        """``_accept`` over a row's tokens of one multi-step call at once, for a request with no stop strings and no
        thinking budget (nothing to decode into text): the tokens up to the first stop token or ``max_new_tokens``
        are kept, exactly as the one-at-a-time rules keep them, and the rest dropped."""
        req = lv.req
        n = min(len(tokens), req.max_new_tokens - len(lv.out))
        stop = next((i for i, t in enumerate(tokens[:n]) if t in req.stop_token_ids), None) if req.stop_token_ids else None
        take = n if stop is None else stop + 1
        lv.out += tokens[:take]
        lv.mask += [1] * take
        lv.logps += logps[:take]
        lv.versions += [version] * take
        lv.sampled += take
        lv.pos += take
        lv.thinking += take * int(lv.inside)
        self.tokens_out += take
        if stop is not None:
            lv.finish = FinishReason.STOP
        elif len(lv.out) >= req.max_new_tokens:
            lv.finish = FinishReason.LENGTH
        if lv.finish is not None:
            self._complete(lv)
            return
        lv.feed = [tokens[take - 1]]

    def _release(self, lv: _Live) -> None:
        with self._cond:
            if lv.slot >= 0 and self._running.get(lv.slot) is lv:
                del self._running[lv.slot]
                self._free.append(lv.slot)
                self.slots.vacate(lv.slot)  # copies reading their prompt from this slot read their own now
            self._cond.notify_all()

    def _complete(self, lv: _Live) -> None:
        self._release(lv)
        if lv.fut.done():
            return
        lv.fut.set_result(EngineOutput(
            request_id=lv.req.request_id, token_ids=tuple(lv.out), logprobs=tuple(lv.logps), sampled_mask=tuple(lv.mask),
            versions=tuple(lv.versions), finish_reason=lv.finish or FinishReason.ABORT, prompt_tokens=len(lv.ids),
            thinking_tokens=lv.thinking, budget_closed=lv.closed, queued_s=0.0,
        ))


__all__ = [
    "Engine", "EngineClosed", "EngineError", "EngineOutput", "EngineRequest", "EngineRequestError", "EngineTimeout",
    "PauseMode",
]
