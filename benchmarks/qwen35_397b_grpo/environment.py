"""Environments the GRPO loop talks to, and the in-process toy one a tiny model can learn (a smoke's stand-in
for the reference's R2E-Gym containers driven by an OpenHands agent, which this harness does not have).

The interface keeps the reference's shape (NeMo-RL@3fca04c9 nemo_rl/environments/nemo_gym.py, NVIDIA-NeMo/Gym
swe_agents): `reset(task)` gives the episode's first prompt as token ids; `step(task, generated)` takes the
tokens the policy generated in one turn and answers with the tokens to append before the next turn (tool
output: never trained), whether the episode is done, and its reward (1 iff the hidden check passes, else 0).
Token ids are kept as the generator made them: a multi-turn history only ever appends.

`KeyedAnswerTask` is the bandit-grade task (one turn, one answer token from a small set): the prompt is
[BOS, d1, key, d2, SEP] and the reward is 1 iff the generated token is the answer a hidden permutation gives
that key. Distractor tokens d1, d2 make many tasks per key; the held-out tasks are (key, d1, d2) combinations
no training batch shows, so a rise of pass@k on them means the model learned key -> answer, not the tasks.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

import numpy as np

PAD, BOS, SEP = 0, 1, 2
FIRST_ANSWER = 3  # answers, then keys, then distractors, in that order from here


@dataclasses.dataclass(frozen=True)
class Step:
    """An environment's answer to one turn: tokens to append (tool output; empty when done), done, reward."""
    observation: tuple[int, ...]
    done: bool
    reward: float


class Environment(Protocol):
    """reset / step over tasks identified by an index into the environment's task list."""

    def reset(self, task: int) -> list[int]:
        """The episode's first prompt, as token ids."""

    def step(self, task: int, generated: Sequence[int]) -> Step:
        """The outcome of one generated turn of `task`'s episode."""


@dataclasses.dataclass(frozen=True)
class KeyedAnswerTask:
    """num_keys keys, each with a hidden answer among num_keys answer tokens; (key, d1, d2) tasks over the
    remaining vocabulary as distractors; the first `eval_tasks` of a seeded shuffle are held out."""
    vocab_size: int
    num_keys: int = 8
    eval_tasks: int = 251
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_keys < 2:
            raise ValueError(f"num_keys must be >= 2, got {self.num_keys}")
        if self.num_distractors < 1:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no distractor token after {FIRST_ANSWER} "
                             f"specials, {self.num_keys} answers and {self.num_keys} keys")
        if not 1 <= self.eval_tasks < self.num_tasks:
            raise ValueError(f"eval_tasks must be in [1, {self.num_tasks}) (the task count), got {self.eval_tasks}")

    @property
    def num_distractors(self) -> int:
        return self.vocab_size - FIRST_ANSWER - 2 * self.num_keys

    @property
    def num_tasks(self) -> int:
        return self.num_keys * self.num_distractors ** 2

    @property
    def prompt_length(self) -> int:
        return 5

    @property
    def answers(self) -> np.ndarray:
        """The answer token of each key (the hidden rule: a seeded permutation of the answer tokens)."""
        return FIRST_ANSWER + np.random.default_rng([self.seed, 1]).permutation(self.num_keys)

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, 2]).permutation(self.num_tasks)

    @property
    def eval_ids(self) -> np.ndarray:
        return self._order()[:self.eval_tasks]

    @property
    def train_ids(self) -> np.ndarray:
        return self._order()[self.eval_tasks:]

    def parts(self, task: int) -> tuple[int, int, int]:
        """(key index, first distractor index, second distractor index) of task `task`."""
        n = self.num_distractors
        return task // (n * n), (task // n) % n, task % n

    def reset(self, task: int) -> list[int]:
        k, a, b = self.parts(task)
        distractor = FIRST_ANSWER + 2 * self.num_keys
        return [BOS, distractor + a, FIRST_ANSWER + self.num_keys + k, distractor + b, SEP]

    def target(self, task: int) -> int:
        return int(self.answers[self.parts(task)[0]])

    def step(self, task: int, generated: Sequence[int]) -> Step:
        """One turn ends the episode: reward 1 iff its first generated token is the key's answer."""
        return Step((), True, float(len(generated) > 0 and int(generated[0]) == self.target(task)))
