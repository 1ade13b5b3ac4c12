"""Rollout workers on Ray: each epoch's batch sampled and graded by an actor (``rlvr.cluster.worker.RolloutWorker``),
and each evaluation run by worker 0.

The driver (``RayRolloutSource``) hands a worker, with each call, a reference to the weights it must sample with (a
state dict of numpy arrays put into Ray's object store once per version, the optimizer step count: by the driver, or
where it holds no weights by the data-parallel learners' rank 0) and a ``torch.Generator``'s state; the worker loads
the weights if it does not hold that version yet, runs the local source's ``sample_and_grade`` (``rlvr.loop.seams``)
and returns the samples, grades, timings and the generator's new state. Epoch e's batch goes to worker e mod W.

The design: ``docs/explanation/cluster.md`` (``rlvr.cluster.rollout``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rlvr.batch.interfaces import Task
from rlvr.batch.record import Record
from rlvr.batch.rollout import Grades, Samples, contiguous_bounds
from rlvr.cluster import READY_TIMEOUT, ClusterError, first_line, stopped
from rlvr.cluster.inflight import batch_from_dict, batch_to_dict
from rlvr.cluster.jobs import Job, epoch_generator_state
from rlvr.cluster.staleness import (
    Shift,
    lookahead,
    sample_versions,
    staleness_stats,
    step_bound,
    token_stats,
    too_old,
)
from rlvr.cluster.weight_sync import weights_payload
from rlvr.cluster.worker import RolloutWorker
from rlvr.config import Config
from rlvr.loop.state import TrainState

MAX_RESTARTS = 100  # per worker, over a run
WORKER_CPUS = 0.5  # Ray CPUs each rollout worker holds (explicit: a default request can pend forever)


class RayRolloutSource:
    """The rollout source on Ray (``rlvr.loop.seams.RolloutSource``), the driver's side: ``cluster.rollout_workers``
    actors, the batches submitted to them (up to ``lookahead`` epochs ahead) and the restarts seen. ``publish``: puts
    a state's weights into the object store and returns the reference (the learners' ``publish_weights``, where the
    driver holds no weights); default: the driver's own."""

    def __init__(self, config: Config, ray: Any, publish: Callable[[TrainState], Any] | None = None) -> None:
        c = config.cluster
        self.publish = publish or (lambda st: ray.put(weights_payload(st.policy.module.state_dict().items())))
        self.ray = ray
        self.max_staleness, self.epochs, self.seed = c.max_staleness, config.algo.epochs, config.seed
        self.split, self.num_prompts = c.split_batch, config.task.prompts_per_epoch
        self.call_timeout = c.call_timeout
        self.bound, self.dropped_total = step_bound(config), 0  # staleness in optimizer steps (rlvr.cluster.staleness)
        self.stale_policy, self.ahead = c.stale_policy, lookahead(config)  # epochs submitted ahead of training
        self.shift = Shift()  # what was sampled against what was trained
        actor = ray.remote(num_cpus=WORKER_CPUS, max_restarts=MAX_RESTARTS, max_task_retries=0)(RolloutWorker)
        self.placement_group = None
        self.workers: list[Any] = []
        self.jobs: dict[int, list[Job]] = {}  # submitted batches (or their parts) by epoch
        self._weights: tuple[int, Any] | None = None  # (version, ObjectRef): put once per version
        # set before any start, which may fail and close what there is
        self._board: Any = None  # a WeightsBoard (cluster.weights_in_flight): workers take the newest weights
        self._group: Any = None  # the CollectiveWeights of weight_sync=collective, formed at the first batch
        if c.address is None:
            self.workers = [actor.remote(config) for _ in range(c.rollout_workers)]
        else:  # one bundle per worker, spread over the nodes where they fit
            from ray.exceptions import GetTimeoutError
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            self.placement_group = placement_group([{"CPU": WORKER_CPUS}] * c.rollout_workers, strategy="SPREAD")
            try:
                ray.get(self.placement_group.ready(), timeout=READY_TIMEOUT)
            except GetTimeoutError as err:
                self.close()
                raise ClusterError(f"the cluster has no room for {c.rollout_workers} workers of "
                                   f"{WORKER_CPUS} CPU within {READY_TIMEOUT:.0f} s") from err
            self.workers = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=i)).remote(config)
                for i in range(c.rollout_workers)]
        self.pids = self._started()
        self.restarts = 0
        self.collective = c.weight_sync == "collective"  # broadcast instead of the object store
        self.inner_steps = config.algo.inner_steps
        if c.weights_in_flight:
            from rlvr.cluster.weight_sync import WeightsBoard

            self._board = ray.remote(num_cpus=0)(WeightsBoard).remote()

    def sample_and_grade(self, st: TrainState, task: Task) -> tuple[Samples, Grades, dict[str, float]]:
        """The batch of epoch ``st.epoch``; first submits the next ``lookahead`` epochs' with the current weights.
        With none ahead and whole batches the driver's generator moves on as if it had sampled the batch itself.
        Any failure is a one-line ClusterError naming the epoch and step (``_stops``)."""
        with _stops(f"epoch {st.epoch}, step {st.step}"):
            return self._sample_and_grade(st, task)

    def evaluate(self, st: TrainState, task: Task) -> list[Record]:
        """``rlvr.loop.evaluation.evaluate`` on worker 0 with the weights of ``st.step`` (a worker that dies meanwhile
        is asked again once Ray restarted it)."""
        with _stops(f"epoch {st.epoch}, step {st.step}: evaluating"):
            weights = self._send_weights(st)
            ask = lambda: self.workers[0].evaluate.remote([weights], st.step, st.epoch)  # noqa: E731
            return self._answer(0, ask(), ask, f"evaluating the weights of step {st.step}")

    def offer_weights(self, st: TrainState) -> None:
        """With ``cluster.weights_in_flight``: post the weights of ``st.step`` where each worker looks before its next
        batch."""
        if self._board is not None:
            with _stops(f"epoch {st.epoch}, step {st.step}: publishing the weights"):
                self._board.post.remote(st.step, [self._send_weights(st)])

    def state(self) -> dict[str, Any] | None:
        """The batches submitted ahead of the trainer, waited for, as checkpoint data (``rlvr.cluster.inflight``),
        the count dropped as too old and the ``Shift``; None for a synchronous run (``max_staleness`` 0)."""
        held = [job for epoch in sorted(self.jobs) for job in self.jobs[epoch]]
        with _stops("checkpoint: waiting for the batches in flight"):
            for job in held:
                self._wait(job)
        if self.max_staleness == 0:
            return None
        return {"batches": [batch_to_dict(job) for job in held], "dropped_stale": self.dropped_total,
                "shift": self.shift.state()}

    def restore(self, state: dict[str, Any] | None) -> None:
        """Take back the batches ``state()`` kept: the resumed run trains on them, not on batches sampled anew."""
        self.dropped_total = 0 if state is None else state.get("dropped_stale", 0)
        self.shift = Shift(None if state is None else state.get("shift"))
        for batch in [] if state is None else state["batches"]:
            fields, result = batch_from_dict(batch)
            job = Job(**fields, weights=None, generator_state=None, result=result)
            self.jobs.setdefault(job.epoch, []).append(job)

    def _sample_and_grade(self, st: TrainState, task: Task) -> tuple[Samples, Grades, dict[str, float]]:
        clock = time.perf_counter()
        last = min(st.epoch + self.ahead, self.epochs - 1)
        for epoch in range(st.epoch, last + 1):
            if epoch not in self.jobs:
                weights = self._send_weights(st)
                self.jobs[epoch] = [self._submit(job) for job in self._jobs(epoch, st, task, weights)]
        sync = time.perf_counter() - clock
        jobs = self.jobs.pop(st.epoch)
        for job in jobs:
            self._wait(job)
        jobs, dropped = self._replace_too_old(jobs, st, task)
        parts = [job.result for job in jobs]
        for part in parts:
            self.shift.add(part[0], part[1], trained=True)
        if self.ahead == 0 and not self.split:
            st.generator.set_state(jobs[0].new_state)
        samples, grades = Samples.cat([p[0] for p in parts]), Grades.cat([p[1] for p in parts])
        # the parts ran at once: the batch took as long as the slowest
        stats = {key: max(p[2].get(key, 0.0) for p in parts) for key in parts[0][2]}
        stats = {**stats, "time/sync": sync, "cluster/weights_version": float(min(job.version for job in jobs)),
                 "cluster/staleness": float(st.epoch - min(job.weights_epoch for job in jobs)),
                 "cluster/worker_restarts": float(self.restarts)}
        if self.max_staleness > 0:  # with k = 0 every batch is 0 steps old: nothing to log
            stats.update(staleness_stats(st.step, sample_versions(jobs), dropped, self.dropped_total))
            admit = float(self.stale_policy == "admit")
            stats.update({"cluster/admission": admit, "cluster/lookahead": float(self.ahead), **self.shift.stats()})
            stats.update(token_stats(st.step, samples))
        return samples, grades, stats

    def _replace_too_old(self, jobs: list[Job], st: TrainState, task: Task) -> tuple[list[Job], int]:
        """``jobs`` (answered) with each whose weights are more than ``cluster.max_staleness_steps`` old at
        ``st.step`` replaced by the same batch (generator and prompts from (seed, epoch)) sampled with the current
        weights; and how many were."""
        old = too_old(jobs, st.step, self.bound)
        if not old:
            return jobs, 0
        self.dropped_total += len(old)
        for job in old:
            self.shift.add(job.result[0], job.result[1], trained=False)
        weights = self._send_weights(st)
        fresh = {job.worker: job for job in self._jobs(st.epoch, st, task, weights)}
        again = {id(job): self._submit(fresh[job.worker]) for job in old}
        for job in again.values():
            self._wait(job)
        return [again.get(id(job), job) for job in jobs], len(old)

    def _jobs(self, epoch: int, st: TrainState, task: Task, weights: Any) -> list[Job]:
        """The jobs of ``epoch``'s batch: the whole batch on worker epoch mod W, or (``cluster.split_batch``) its
        prompts drawn here and split over the workers, each part with a generator seeded from the epoch's stream."""
        if self.ahead == 0:
            generator = st.generator  # the run's own stream: a whole batch hands its new state back
        else:
            generator = torch.Generator()
            generator.set_state(epoch_generator_state(self.seed, epoch))
        if not self.split:
            return [Job(epoch, epoch % len(self.workers), st.step, st.epoch, weights, generator.get_state())]
        prompts = task.sample_prompts(self.num_prompts, generator)
        bounds = contiguous_bounds(len(prompts), len(self.workers))
        seeds = torch.randint(0, 2**62, (len(self.workers),), generator=generator).tolist()
        return [Job(epoch, w, st.step, st.epoch, weights, torch.Generator().manual_seed(seed).get_state(),
                    prompts[start:stop])
                for w, ((start, stop), seed) in enumerate(zip(bounds, seeds)) if stop > start]

    def _submit(self, job: Job) -> Job:
        job.ref = self.workers[job.worker].sample_and_grade.remote([job.weights], job.version, job.generator_state,
                                                                   job.prompts, job.epoch, self._board)
        return job

    def _wait(self, job: Job) -> None:
        """The job's result into ``job.result`` (once); a worker that died meanwhile is sent the job again."""
        if job.result is not None:
            return
        what = f"sampling and grading the batch of epoch {job.epoch} (weights version {job.version})"
        samples, grades, stats, job.new_state, pid, version = self._answer(
            job.worker, job.ref, lambda: self._submit(job).ref, what)
        job.result = samples, grades, stats
        if version != job.version:  # newer weights, taken in flight: made during epoch version // inner_steps
            job.version, job.weights_epoch = version, version // self.inner_steps
        self._seen(job.worker, pid)

    def _answer(self, worker: int, ref: Any, again: Callable[[], Any], what: str) -> Any:
        """The answer of worker ``worker``'s call ``ref`` within ``cluster.call_timeout``; if the worker died, once
        Ray restarted it, that of ``again()`` (the call made again). ``what``: the call, for the one-line error."""
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        while True:
            try:
                return self.ray.get(ref, timeout=self.call_timeout)
            except ActorDiedError as err:
                raise ClusterError(f"rollout worker {worker} is dead (restarts used up): {err}") from err
            except RayActorError as err:  # killed or lost: it restarts with fresh state; ask again
                if self.collective:
                    raise ClusterError(f"rollout worker {worker} died: weight_sync=collective cannot take a "
                                       "restarted worker back into its group (weight_sync=object_store survives "
                                       "restarts)") from err
                self._wait_ready(worker)
                ref = again()
            except GetTimeoutError as err:
                raise ClusterError(f"rollout worker {worker} gave no answer within {self.call_timeout:g} s "
                                   f"(cluster.call_timeout) while {what}") from err

    def _send_weights(self, st: TrainState) -> Any:
        """The weights of ``st.step`` to the workers: broadcast now (None: nothing to pass with the call), or the
        object store reference each call passes (published once per version)."""
        version = st.step
        if self.collective:
            if self._group is None:
                from rlvr.cluster.weight_sync import CollectiveWeights

                wait = (1 + self.ahead) * self.call_timeout  # a broadcast waits for up to k + 1 queued batches
                self._group = CollectiveWeights(self.ray, self.workers, st.policy.module, wait)
            if self._weights is None or self._weights[0] != version:
                self._group.send(st.policy.module, version)
                self._weights = (version, None)
            return None
        if self._weights is None or self._weights[0] != version:
            self._weights = (version, self.publish(st))  # queued jobs keep the old one alive
        return self._weights[1]

    def _wait_ready(self, index: int) -> None:
        """Wait until the restarted worker answers (calls fail at once while it restarts)."""
        from ray.exceptions import ActorDiedError, RayActorError

        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                pid = self.ray.get(self.workers[index].pid.remote(), timeout=READY_TIMEOUT)
                break
            except ActorDiedError as err:
                raise ClusterError(f"rollout worker {index} is dead (restarts used up): {err}") from err
            except RayActorError as err:
                if time.monotonic() > deadline:
                    raise ClusterError(f"rollout worker {index} did not come back within {READY_TIMEOUT:.0f} s"
                                       ) from err
                time.sleep(0.2)
        self._seen(index, pid)

    def _seen(self, index: int, pid: int) -> None:
        """Worker ``index`` answered from process ``pid``: a new one is a restart."""
        if pid != self.pids[index]:
            self.pids[index] = pid
            self.restarts += 1

    def _started(self) -> list[int]:
        """Each worker's process id once all are up; a worker that fails to start, or takes longer than
        READY_TIMEOUT, ends them all (ClusterError)."""
        from ray.exceptions import RayActorError

        refs = [w.pid.remote() for w in self.workers]
        _, pending = self.ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT)  # a failed start is ready too
        pids, problems = [], []
        for i, ref in enumerate(refs):
            try:
                if ref in pending:
                    problems.append(f"rollout worker {i} did not start within {READY_TIMEOUT:g} s (building its "
                                    "task and policy)")
                else:
                    pids.append(self.ray.get(ref))
            except RayActorError as err:
                problems.append(f"rollout worker {i} failed to start: {first_line(err)}")
        if problems:
            self.close()
            raise ClusterError(problems[0])
        return pids

    def worker_pids(self) -> list[int]:
        return self.ray.get([w.pid.remote() for w in self.workers], timeout=READY_TIMEOUT)

    def worker_nodes(self) -> list[str]:
        return self.ray.get([w.node_id.remote() for w in self.workers], timeout=READY_TIMEOUT)

    def close(self) -> None:
        self.jobs, self._weights = {}, None
        if self._board is not None:
            self.ray.kill(self._board)
            self._board = None
        if self._group is not None:
            self._group.close()
            self._group = None
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []
        if self.placement_group is not None:  # after its actors are gone
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None


@contextlib.contextmanager
def _stops(where: str) -> Iterator[None]:
    """Any failure inside, Ray's own included (a node that died), as the one-line ClusterError naming ``where``."""
    from ray.exceptions import RayError

    try:
        yield
    except (ClusterError, RayError) as err:
        raise stopped(where, err) from err
