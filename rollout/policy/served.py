"""``ServedPolicy``: episodes generate through one or more inference servers, token in and token out.

What training through servers needs of a policy (verl's, SkyRL's and slime's rollout servers work the
same way): the episode's exact token ids go to the server, and the sampled token ids come back with
each token's logprob and the weight version that sampled it, so the learner trains on exactly what was
sampled and the staleness bound counts real versions. The route is vLLM's token-in/token-out
``POST /inference/v1/generate`` (``rollout.engine_routes``; ``agentenv serve`` and vLLM >= 0.22 speak it):
nothing is re-rendered or re-tokenized on the server.

**The same turn as in process**: with the learner's ``tokenizer`` given, the seed sent is ``HFPolicy``'s turn
seed (the episode's seed and the turn's index) and the text is decoded as ``HFPolicy`` decodes it, so a served
turn is ``HFPolicy.generate``'s token for token at the same weights (tested).

**Several servers** (``ServerFleet``): each turn goes to the live server with the fewest requests in
flight from this process, ties broken round-robin, so a fleet is shared evenly whatever the turns'
lengths. Turns of one episode may land on different servers: they all hold the same version (the
learner publishes each version to every server before the next one; each token's own version is
reported anyway).

**A server lost** (connection refused or reset, the process gone mid-request, a request aborted by
``/pause?mode=abort``, no answer within ``timeout_s``): the turn raises ``ServerLost``, an
``EpisodeLost``, so the episode runner drops the attempt and reruns the episode from the start on a fresh
sandbox (``rollout.retries.sandbox_acquire`` attempts); nothing of the lost attempt is stored or trained.
A server that refused a connection or dropped one is marked dead in the fleet and gets no more turns, and
the learner's publisher leaves it out (``learner.serving``). With no live server left a turn raises
``PolicyError`` naming every URL and why it is dead ("connection failed": counted as infrastructure).
A server that answers with an error (4xx: the request; 5xx: the server) is a ``PolicyError`` naming the
URL and the status, as ``OpenAIPolicy`` reports it.

>>> fleet = ServerFleet(["http://127.0.0.1:8000", "http://127.0.0.1:8001"])   # doctest: +SKIP
>>> policy = ServedPolicy(fleet, model="tiny", tokenizer=tok)                  # doctest: +SKIP
>>> gen = await policy.generate(Prompt(token_ids=ids), SamplingParams(temperature=0.7))  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from rollout.attempt import EpisodeLost
from rollout.policy.hf import turn_seed
from rollout.policy.types import FinishReason, Generation, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.tokenizer import EOT

__all__ = ["GENERATE_ROUTE", "ServedPolicy", "ServerFleet", "ServerLost", "server_root"]

GENERATE_ROUTE = "/inference/v1/generate"

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


class ServerLost(EpisodeLost):
    """A server went away under a turn; the episode is rerun (``EpisodeLost``). ``url`` names the server."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


def server_root(url: str) -> str:
    """``http://host:port`` from a server URL given with or without the OpenAI ``/v1`` suffix."""
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class ServerFleet:
    """The servers a run generates on: which are live, and how many requests each has in flight.

    Thread-safe (the publisher marks servers from its threads). A server marked dead stays dead for the
    rest of the run: it missed a published version, so it would sample stale weights if it came back.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        if isinstance(urls, str) or not urls:
            raise ValueError(f"urls: expected a non-empty list of server URLs, got {urls!r}")
        roots = [server_root(u) for u in urls]
        for i, root in enumerate(roots):
            if not root.startswith(("http://", "https://")):
                raise ValueError(f"urls[{i}]: expected an http(s):// URL, got {urls[i]!r}")
        if len(set(roots)) != len(roots):
            raise ValueError(f"urls: each server once, got {list(urls)}")
        self.urls: tuple[str, ...] = tuple(roots)
        self.dead: dict[str, str] = {}
        self.in_flight: dict[str, int] = dict.fromkeys(roots, 0)
        self.served: dict[str, int] = dict.fromkeys(roots, 0)
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def live(self) -> list[str]:
        with self._lock:
            return [u for u in self.urls if u not in self.dead]

    def mark_dead(self, url: str, why: str) -> None:
        with self._lock:
            self.dead.setdefault(url, why)

    def acquire(self) -> str:
        """The live server with the fewest requests in flight (ties: round-robin); counted until ``release``."""
        with self._lock:
            live = [u for u in self.urls if u not in self.dead]
            if not live:
                causes = "; ".join(f"{u}: {why}" for u, why in self.dead.items())
                raise PolicyError(f"connection failed: no live inference server left ({causes})")
            start = next(self._turn) % len(live)
            ordered = live[start:] + live[:start]
            url = min(ordered, key=lambda u: self.in_flight[u])
            self.in_flight[url] += 1
            self.served[url] += 1
            return url

    def release(self, url: str) -> None:
        with self._lock:
            self.in_flight[url] -= 1

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"servers": list(self.urls), "dead_servers": dict(self.dead), "turns_per_server": dict(self.served)}


class ServedPolicy(Policy):
    """A ``Policy`` whose turns are generated by the servers of ``fleet`` (see the module docstring).

    ``model``: the served model name sent with each request (None: whatever the server serves).
    ``tokenizer``: decodes the text when a server does not return it. ``api_key``: sent as a bearer token.
    ``timeout_s``: one turn's deadline; past it the server counts as lost for this turn (the episode reruns).
    """

    def __init__(
        self, fleet: ServerFleet, *, model: str | None = None, tokenizer: Any = None, api_key: str | None = None,
        timeout_s: float = 120.0, name: str = "served",
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: expected > 0, got {timeout_s}")
        self.fleet = fleet
        self.model = model
        self.tokenizer = tokenizer
        self._tok_lock = threading.Lock()
        # HFPolicy's turn seeds: turn k of an episode samples from seed (episode seed, k), wherever it runs
        eot = tokenizer.convert_tokens_to_ids(EOT) if tokenizer is not None else None
        self.eot_id = int(eot) if isinstance(eot, int) and eot != tokenizer.unk_token_id else None
        self.timeout_s = float(timeout_s)
        self.name = name
        self._version = 0
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None

    @property
    def version(self) -> int:
        """The version the learner last published to every server (a turn reports the server's own)."""
        return self._version

    def set_version(self, version: int) -> None:
        self._version = int(version)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a connection pool belongs to one event loop
        return state

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers)
        return self._client

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        if not prompt.token_ids:
            raise PolicyError("ServedPolicy: the prompt has no token ids (the episode runner needs a tokenizer)")
        seed = sampling.seed
        if seed is not None and self.eot_id is not None:
            seed = turn_seed(int(seed), sum(t == self.eot_id for t in prompt.token_ids))
        params: dict[str, Any] = {
            "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "seed": seed, "stop": [s for s in sampling.stop if s], "logprobs": 1,
        }
        if budget is not None:
            params["thinking_budget"] = budget.max_thinking_tokens
        body: dict[str, Any] = {"token_ids": list(prompt.token_ids), "sampling_params": params}
        if self.model is not None:
            body["model"] = self.model
        url = self.fleet.acquire()
        try:
            resp = await self._http().post(url + GENERATE_ROUTE, json=body)
        except httpx.TimeoutException as exc:
            raise ServerLost(f"{url}: no response within {self.timeout_s}s ({type(exc).__name__})", url) from exc
        except httpx.TransportError as exc:  # refused, reset, the process gone mid-request: it is dead to this run
            why = f"connection failed ({type(exc).__name__}: {exc})"
            self.fleet.mark_dead(url, why)
            raise ServerLost(f"{url}: {why}", url) from exc
        finally:
            self.fleet.release(url)
        return self._generation(url, resp)

    def _generation(self, url: str, resp: httpx.Response) -> Generation:
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.status_code != 200:
            message = data.get("message") if isinstance(data, dict) else None
            raise PolicyError(f"{url}{GENERATE_ROUTE}: HTTP {resp.status_code}: {message or resp.text[:300]}")
        try:
            choice: Mapping[str, Any] = data["choices"][0]
            ids = tuple(int(t) for t in choice["token_ids"])
            logprobs = tuple(float(e["logprob"]) for e in choice["logprobs"]["content"])
            ext: Mapping[str, Any] = data.get("agentenv") or {}
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PolicyError(f"{url}{GENERATE_ROUTE}: unexpected answer ({type(exc).__name__}: {exc}): "
                              f"{resp.text[:300]!r}") from exc
        finish = _FINISH.get(str(choice.get("finish_reason")), FinishReason.LENGTH)
        if finish is FinishReason.ABORT:  # paused with mode=abort: the turn never finished
            raise ServerLost(f"{url}: the request was aborted by the server", url)
        versions = tuple(int(v) for v in ext.get("token_versions") or ())
        version = int(ext.get("policy_version", min(versions, default=self._version)))
        text = choice.get("text")
        if self.tokenizer is not None:  # HFPolicy's text: special tokens (the end of turn) left out
            with self._tok_lock:
                text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return Generation(
            text=str(text or ""), token_ids=ids, logprobs=logprobs, finish_reason=finish, policy_version=version,
            thinking_tokens=int(ext.get("thinking_tokens", 0)), sampled_mask=tuple(int(m) for m in ext.get("sampled_mask") or ()),
            budget_closed=bool(ext.get("budget_closed", False)),
            token_versions=versions if len(set(versions)) > 1 else (),
            extra={"server": url, "version_source": "server" if "policy_version" in ext else "policy"},
        )
