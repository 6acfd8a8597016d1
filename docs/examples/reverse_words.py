"""A task of one's own, outside the library: reverse a word, exact match. From the folder that holds this file:
`python -m lopd_ray.train recipes/grpo_letters_cpu.yaml env.name=reverse_words:ENV env.options.word_length=3`."""
import random
from dataclasses import dataclass

from lopd_ray.envs import Env, EnvSpec, StepResult, Task, TaskList
from lopd_ray.errors import ConfigError


@dataclass
class ReverseOptions:  # env.options.* of the run, type-checked against these fields
    num_tasks: int = 64  # per split
    word_length: int = 4


class ReverseEnv(Env):
    def __init__(self):
        super().__init__(max_turns=1)  # one answer per episode

    def reset(self, task: Task) -> None:
        self.answer = task.meta["answer"]

    def step(self, action_text: str) -> StepResult:
        return StepResult(done=True, reward=float(action_text.strip() == self.answer))


class ReverseTasks(TaskList):
    def __init__(self, options: ReverseOptions, split: str):
        if split not in ("train", "test"):
            raise ConfigError(f"env.split={split}: reverse_words has the splits train and test")
        rng = random.Random(0)
        words = ["".join(rng.choice("abcdefgh") for _ in range(options.word_length))
                 for _ in range(2 * options.num_tasks)]
        chosen = words[:options.num_tasks] if split == "train" else words[options.num_tasks:]
        self.tasks = [Task(f"reverse-{split}-{i}", [{"role": "user", "content": f"Reverse the word: {word}"}],
                           meta={"answer": word[::-1]}) for i, word in enumerate(chosen)]

    def reference_solution(self, index: int) -> str:
        return self.tasks[index].meta["answer"]  # what OPSD's teacher is shown; what seeds LOPD's bank


def make(env_cfg, options: ReverseOptions):
    return ReverseEnv, ReverseTasks(options, env_cfg.split)


ENV = EnvSpec(make, options=ReverseOptions, reads=("env.split",))
