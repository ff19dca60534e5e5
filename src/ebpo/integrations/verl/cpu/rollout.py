"""A real rollout for verl on the CPU: a Hugging Face model in a Ray actor, weights synced from the actor.

verl 0.9 samples through "rollout replicas" (``verl.workers.rollout.replica.RolloutReplica``), each an
inference server with token-in/token-out ``generate`` that verl's agent loop calls once per sample, and a
``BaseRollout`` adapter inside the training worker that pushes the trainer's weights into the server at
every step (``CheckpointEngineManager.update_weights`` -> worker ``update_weights`` -> adapter
``update_weights``). Stock verl has only vLLM / SGLang / TRT-LLM servers. This module adds one backend,
``ebpo_cpu``, through verl's own registries:

- :class:`CPURolloutReplica` in ``RolloutReplicaRegistry`` (``rollout.name=ebpo_cpu``): starts one
  :class:`CPURolloutServer` actor per replica (hybrid mode: it shares the training workers' slots).
- :class:`CPURolloutServer`: loads the model from ``actor_rollout_ref.model.path`` and answers ``generate``
  with ``ebpo.generation.sample`` (KV cache, temperature / top-p, EOS stop, log-probs at the sampling
  temperature). Concurrent requests with the same sampling settings are decoded as one batch.
- :class:`CPURolloutAdapter` in ``_ROLLOUT_REGISTRY[("ebpo_cpu", "async")]`` (verl's adapter table, keyed by
  name and mode, whose values are import paths): collects the full tensors FSDP hands it in
  ``update_weights`` (every rank must iterate them: they are gathered collectively) and rank 0 of the
  replica loads them into the server, tagged with the trainer's ``global_steps``.

So every step samples with the weights the actor has after the previous update: the same contract as
verl's colocated vLLM. The returned ``TokenOutput.extra_fields["global_steps"]`` records which weights
produced each sample.

Partial rollout (verl's ``colocate_async``): ``abort_all_requests`` answers every request not yet delivered with
``stop_reason="aborted"`` and the tokens generated so far, and holds new requests until ``resume_generation``,
as verl's vLLM server does; verl's ``FullyAsyncLLMServerClient`` then sends prompt + those tokens again, which
the new weights continue, and tags the response with the versions it spans (``min_global_steps``,
``max_global_steps``). A queued request has no tokens yet. A batch being decoded runs to its end (the CPU
decodes a batch in one call), so its requests are cut where the abort would have found them: the first half of
each response (whole tokens, rounded down) counts as generated before the abort. Which requests an abort finds
depends on timing, so an async run is not reproducible, as with verl's own servers.

Reproducible (``sync``): a response depends on the run's seed, the weights' version (the trainer's ``global_steps``), the
prompt, the sampling settings and its draw ``k`` (the k-th request with that prompt and those settings for
this version), never on when it arrived or which requests shared its batch: each request is sampled from a
generator seeded from those five (:func:`request_seed`; ``ebpo.generation.sample(generators=...)`` draws each
row from its own). verl's agent loop sends a group's ``n`` requests without saying which session each is
(tokenization runs in a thread pool, so they arrive in any order); ``extra_fields["ebpo_draw"] = k`` lets the
replay buffer (:class:`ebpo.integrations.verl.v1.EBPOReplayBuffer`) order a group's rows by draw. Two groups
of one prompt in one step share draws 0..2n-1, split between them in arrival order; with several rollout
replicas (ranks > 1) the split of a group's requests between them is verl's, so only a single-replica run is
reproducible. Batching changes the log-probs in their last bits (the shapes of the matrix products), not the
tokens drawn in our runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any, cast

import ray
import torch
from ray.actor import ActorHandle
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

__all__ = [
    "ROLLOUT_NAME",
    "CPURolloutServer",
    "request_seed",
    "CPURolloutReplica",
    "CPURolloutAdapter",
    "register_rollout",
    "server_actor_name",
]

ROLLOUT_NAME = "ebpo_cpu"


def server_actor_name(replica_rank: int) -> str:
    """Ray name of the server actor of ``replica_rank`` (the adapter in the worker looks it up by name)."""
    return f"ebpo_cpu_rollout_server_{replica_rank}"


def request_seed(
    seed: int, version: int | None, settings: dict[str, Any], prompt_ids: list[int], draw: int
) -> int:
    """The sampling seed of one request: a hash of the run's seed, the weights' version, the sampling settings,
    the prompt's token ids and the request's draw number among its identical requests (63 bits)."""
    key = repr((int(seed), version, sorted(settings.items()), list(prompt_ids), int(draw))).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


class CPURolloutServer:
    """Token-in/token-out sampling server over a Hugging Face causal LM on the CPU (a Ray actor).

    Args:
        model_path: directory the model and tokenizer load from (``actor_rollout_ref.model.path``).
        response_length: default ``max_tokens`` (verl's agent loop sends none: vLLM uses this too).
        seed: the run's sampling seed (:func:`request_seed`).
        trust_remote_code: passed to ``from_pretrained``.
    """

    def __init__(
        self, model_path: str, response_length: int, seed: int = 0, trust_remote_code: bool = False
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(int(os.environ.get("EBPO_CPU_ROLLOUT_THREADS", "1")))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, torch_dtype=torch.float32, trust_remote_code=trust_remote_code
        ).eval()
        self.response_length = int(response_length)
        self.seed = int(seed)
        self.global_steps: int | None = None
        self._draws: dict[tuple, int] = {}  # (settings, prompt) -> requests seen for this weight version
        self.weight_updates = 0
        self._pending: list[tuple[list[int], dict[str, Any], int, asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None
        self._aborts = 0  # abort_all_requests calls so far: a batch started before one is cut
        self._running: asyncio.Event | None = None  # cleared between an abort and resume_generation
        self.aborted_requests = 0

    # -- weights -----------------------------------------------------------------------------------------
    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the trainer's full tensors (names as in the HF ``state_dict``); returns the number loaded."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(
                f"update_weights: {len(unknown)} tensor names the rollout model does not have, e.g. {unknown[:3]}"
            )
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self.global_steps = global_steps
        self._draws.clear()
        self.weight_updates += 1
        return len(state)

    def weight_checksum(self) -> float:
        """Sum of every parameter (tests compare it with the trainer's weights)."""
        return float(sum(p.double().sum() for p in self.model.parameters()))

    def info(self) -> dict[str, Any]:
        return {
            "global_steps": self.global_steps,
            "weight_updates": self.weight_updates,
            "aborted_requests": self.aborted_requests,
        }

    # -- generation --------------------------------------------------------------------------------------
    @staticmethod
    def _settings(sampling_params: dict[str, Any], response_length: int) -> dict[str, Any]:
        top_k = sampling_params.get("top_k", -1)
        if top_k not in (None, -1, 0):
            raise ValueError(
                f"rollout.name={ROLLOUT_NAME}: top_k={top_k} is not supported (temperature and top_p are); "
                "set actor_rollout_ref.rollout.top_k=-1"
            )
        if float(sampling_params.get("repetition_penalty", 1.0)) != 1.0:
            raise ValueError(f"rollout.name={ROLLOUT_NAME}: repetition_penalty must be 1.0")
        max_tokens = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        return {
            "temperature": float(sampling_params.get("temperature", 1.0)),
            "top_p": float(sampling_params.get("top_p", 1.0)),
            "max_new_tokens": int(max_tokens if max_tokens is not None else response_length),
            "logprobs": bool(sampling_params.get("logprobs", False)),
        }

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **unused: Any
    ):
        """One response to ``prompt_ids`` (verl's ``TokenOutput``); concurrent calls are batched."""
        for key in ("image_data", "video_data", "audio_data"):
            if unused.get(key) is not None:
                raise ValueError(f"rollout.name={ROLLOUT_NAME} is text-only; got {key}")
        settings = self._settings(sampling_params, self.response_length)
        await self._gate().wait()  # between an abort and resume_generation, requests wait
        prompt = [int(t) for t in prompt_ids]
        identity = (tuple(sorted(settings.items())), tuple(prompt))
        draw = self._draws.get(identity, 0)
        self._draws[identity] = draw + 1
        seed = request_seed(self.seed, self.global_steps, settings, prompt, draw)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, settings, seed, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        token_ids, log_probs, aborted = await future
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if settings["logprobs"] else None,
            stop_reason="aborted" if aborted else "completed",
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps, "ebpo_draw": draw},
        )

    async def _run_batches(self) -> None:
        while self._pending:
            await asyncio.sleep(0.05)  # let the agent loop's concurrent requests arrive
            batch, self._pending = self._pending, []
            groups: dict[tuple, list] = {}
            for item in batch:
                groups.setdefault(tuple(sorted(item[1].items())), []).append(item)
            for key, items in groups.items():
                aborts = self._aborts
                try:
                    results = await asyncio.get_running_loop().run_in_executor(
                        None,
                        self._sample,
                        [p for p, _, _, _ in items],
                        dict(key),
                        [s for _, _, s, _ in items],
                    )
                except Exception as error:  # hand the error to every waiting request
                    for _, _, _, future in items:
                        future.set_exception(error)
                    continue
                cut = self._aborts != aborts  # an abort came while this batch decoded
                for (_, _, _, future), (token_ids, log_probs) in zip(items, results):
                    if future.done():
                        continue
                    if cut:
                        half = len(token_ids) // 2
                        self.aborted_requests += 1
                        future.set_result((token_ids[:half], log_probs[:half], True))
                    else:
                        future.set_result((token_ids, log_probs, False))

    def _gate(self) -> asyncio.Event:
        if self._running is None:
            self._running = asyncio.Event()
            self._running.set()
        return self._running

    def _sample(
        self, prompts: list[list[int]], settings: dict[str, Any], seeds: list[int]
    ) -> list[tuple[list[int], list[float]]]:
        from ebpo.generation import sample

        rollouts = sample(
            self.model,
            self.tokenizer,
            prompts,
            n=1,
            temperature=settings["temperature"],
            top_p=settings["top_p"],
            max_new_tokens=settings["max_new_tokens"],
            generators=seeds,  # each request from its own seed: independent of the batch it shares
        )
        out = []
        for row in range(len(prompts)):
            length = int(rollouts.lengths[row])
            out.append(
                (
                    rollouts.response_ids[row, :length].tolist(),
                    rollouts.old_logp[row, :length].tolist(),
                )
            )
        return out

    # -- verl's server control calls: nothing to free on the CPU; abort and resume for partial rollout ------
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Partial rollout: every request not yet answered returns ``aborted`` with its tokens so far (module
        docstring); new requests wait for :meth:`resume_generation`."""
        self._gate().clear()
        self._aborts += 1
        queued, self._pending = self._pending, []
        for _, _, _, future in queued:  # not started: no tokens yet
            if not future.done():
                self.aborted_requests += 1
                future.set_result(([], [], True))

    async def resume_generation(self) -> None:
        self._gate().set()

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class CPURolloutReplica(RolloutReplica):
    """One :class:`CPURolloutServer` per replica, sharing the hybrid training workers' slots."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        model_path = getattr(self.model_config, "local_path", None) or self.model_config.path
        server_cls = ray.remote(num_cpus=0)(CPURolloutServer)
        server = server_cls.options(
            name=server_actor_name(self.replica_rank), max_concurrency=self.max_concurrency
        ).remote(
            model_path,
            self.config.response_length,
            seed=int(getattr(self.config, "seed", 0) or 0) + 1000 * self.replica_rank,
            trust_remote_code=bool(getattr(self.model_config, "trust_remote_code", False)),
        )
        # an ActorHandle: ray types ActorClass.remote as `ActorHandle[T] | type[T]` so that method calls type-check
        self._server_handle = cast(ActorHandle, server)
        await self._server_handle.info.remote()  # wait until the model is loaded
        self.servers = [self._server_handle]
        self._server_address = server_actor_name(self.replica_rank)


class CPURolloutAdapter(BaseRollout):
    """Inside the training worker: pushes the actor's weights into this replica's server every step."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh, *args, **kwargs)
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.replica_rank, self.replica_local_rank = divmod(rank, world)
        self.is_leader_rank = self.replica_local_rank == 0
        self._server: ActorHandle | None = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"rollout.name={ROLLOUT_NAME} takes full named tensors, not {wire_format!r}")
        state = {}
        for name, tensor in weights:  # every rank iterates: FSDP gathers the full tensors collectively
            if self.is_leader_rank:
                state[name] = tensor.detach().to("cpu", copy=True)
        if self.is_leader_rank:
            await self._server_handle().update_weights.remote(state, kwargs.get("global_steps"))


def register_rollout() -> None:
    """Register ``rollout.name=ebpo_cpu`` in verl's replica registry and its adapter table (idempotent)."""
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: CPURolloutReplica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.CPURolloutAdapter"
