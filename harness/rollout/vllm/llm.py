"""``VllmEngine``: ``vllm.LLM`` (sync) or ``AsyncLLM`` (async, on a private event loop)
with the harness's request/result format (``translate``), ``collective_rpc`` to the
internal workers and an idempotent shutdown. Configured by ``config``; owned by
``engine.VllmEngineWorker`` / ``engine.VllmEngineProcesses``.

Sync batches are scheduled the same way on every rerun; an async batch enters
the scheduler whole (``_generate_async``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from harness.model.config import ModelConfig
from harness.rollout.vllm import require_vllm, translate
from harness.rollout.vllm.config import cold_cache_env, engine_env, engine_kwargs
from harness.spec.typed import as_workload

_ids = itertools.count()


class _LoopThread:
    """A private event loop in a daemon thread: AsyncLLM lives on it, callers block on results."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)


class VllmEngine:
    """``vllm.LLM`` (sync) or ``AsyncLLM`` (async) with the harness's request/result format.

    Every public method is serialised by one lock (a refit never interleaves
    with a generation, as in the native engine).
    """

    def __init__(self, spec: Mapping[str, Any], model_dir: str, *, is_async: bool, in_process: bool,
                 worker_cls: str | None, profiler_class_path: str | None, rank_prefix: int) -> None:
        require_vllm()
        from harness.rollout.engine_worker import resolve_eos_token_id

        spec = as_workload(spec)
        os.environ.update(engine_env(spec, in_process=in_process))
        if spec.platform.device == "cuda":
            os.environ.update(cold_cache_env(os.path.join(os.path.dirname(os.path.abspath(model_dir)), "jit-cache")))
        self.model = ModelConfig.from_spec(spec.model)
        self.eos_token_id = resolve_eos_token_id(spec)
        self.is_async = is_async
        self.tp = spec.rollout.tp
        self._lock = threading.RLock()
        kw = engine_kwargs(spec, model_dir, worker_cls=worker_cls, profiler_class_path=profiler_class_path,
                           rank_prefix=rank_prefix)
        self._loop: _LoopThread | None = None
        if is_async:
            self._loop = _LoopThread("vllm-async-engine")

            async def build():
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM

                return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))

            try:
                self.llm = self._loop.run(build())
            except BaseException:
                self._loop.stop()
                raise
        else:
            from vllm import LLM

            self.llm = LLM(**kw)

    # -- collective_rpc -----------------------------------------------------------------
    def rpc(self, method: str, kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """``collective_rpc(method, kwargs)``: one result per internal worker, in rank order."""
        with self._lock:
            if self._loop is not None:
                return self._loop.run(self.llm.collective_rpc(method, kwargs=dict(kwargs or {})))
            return self.llm.collective_rpc(method, kwargs=dict(kwargs or {}))

    # -- generation -----------------------------------------------------------------------
    def generate(self, requests: Sequence[Mapping[str, Any]], weight_version: int) -> list[dict]:
        """Results in request order (``translate.result_of``)."""
        from vllm import SamplingParams

        translate.check_requests(requests, vocab=self.model.vocab, max_position=self.model.max_position)
        results: list[dict | None] = [None] * len(requests)
        todo: list[tuple[int, Mapping[str, Any], Any]] = []
        for i, request in enumerate(requests):
            kw = translate.sampling_kwargs(request, eos_token_id=self.eos_token_id,
                                           max_position=self.model.max_position)
            if kw["max_tokens"] <= 0:
                results[i] = translate.empty_result(request, weight_version=weight_version)
            else:
                todo.append((i, request, SamplingParams(**kw)))
        with self._lock:
            if self._loop is not None:
                outputs = self._loop.run(self._generate_async(todo))
            elif todo:
                outputs = self.llm.generate([translate.prompt_of(r) for _, r, _ in todo],
                                            [sp for _, _, sp in todo], use_tqdm=False)
            else:
                outputs = []
        for (i, request, _), output in zip(todo, outputs):
            results[i] = translate.result_of(request, output.outputs[0], eos_token_id=self.eos_token_id,
                                             weight_version=weight_version)
        return results  # type: ignore[return-value]

    async def _generate_async(self, todo: list) -> list:
        """Submit the whole batch, then collect every request's final output.

        The scheduler is paused (``mode="keep"``: new requests are queued, none
        is scheduled) while the batch is added and resumed once all of it is
        queued, so every request enters the same first step. Without that the
        engine core starts stepping on the first arrivals, the batch
        composition depends on timing, and on a GPU the sampled-token logprobs
        (and the rollout window's operator counts) differed between reruns
        (measured on the H200: same tokens, different low bits). A build
        without ``pause_generation`` streams the requests as they are added.
        """
        pause = getattr(self.llm, "pause_generation", None)
        queues = []
        if pause is not None:
            await pause(mode="keep", clear_cache=False)
        try:
            for _, request, params in todo:
                rid = f"{request['request_id']}#{next(_ids)}"
                queues.append((request, await self.llm.add_request(rid, translate.prompt_of(request), params)))
        finally:
            if pause is not None:
                await self.llm.resume_generation()

        async def final_of(request, queue):
            out = None
            while out is None or not out.finished:
                out = queue.get_nowait() or await queue.get()
            if out is None or not out.finished:
                raise RuntimeError(f"vLLM async engine returned no final output for request {request['request_id']!r}")
            return out

        return list(await asyncio.gather(*(final_of(r, q) for r, q in queues)))

    # -- shutdown ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the engine (and its processes); idempotent."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            if self._loop is not None:
                async def close() -> None:  # shut down on the engine's loop, then end its tasks
                    llm.shutdown()
                    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)

                self._loop.run(close())
            else:
                engine = getattr(llm, "llm_engine", None)
                core = getattr(engine, "engine_core", None)
                if core is not None and hasattr(core, "shutdown"):
                    core.shutdown()
        finally:
            if self._loop is not None:
                self._loop.stop()
