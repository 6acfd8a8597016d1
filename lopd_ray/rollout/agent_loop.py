"""Token-in/token-out episodes: the engine's token ids are kept as generated; observation tokens are the
difference between two chat-template renders, so the conversation is never re-tokenized."""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Optional

from lopd_ray.data.trajectory import Trajectory
from lopd_ray.envs.base import Env, Task
from lopd_ray.rollout.engines.base import Generation, InferenceEngine, SamplingSpec, generate_isolated


@dataclass
class Episode:
    task: Task
    group_id: int
    spec: SamplingSpec
    env: Env
    messages: list[dict] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    action_texts: list[str] = field(default_factory=list)
    observation_texts: list[str] = field(default_factory=list)
    token_classes: list[int] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    # Why the episode failed (an exception in the env or the engine); a failed episode never trains.
    error: Optional[str] = None
    context_full: bool = False
    observations_cut: int = 0

    def fail(self, where: str, exc: Exception) -> None:
        self.done, self.error = True, f"{where}: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


MAX_ERROR_CHARS = 1000


@dataclass(frozen=True)
class EpisodeLimits:
    context_tokens: Optional[int] = None  # prompt + response; None: unbounded (rollout.max_model_len)
    observation_chars: int = 0            # per env message; 0: never cut (rollout.max_observation_chars)
    concurrent_env_steps: int = 1         # env steps of a turn run side by side (rollout.env_concurrency)


def cut_observation(messages: list[dict], max_chars: int) -> tuple[list[dict], int]:
    """The env's messages with each content cut to `max_chars` (a note at the end says how much was cut), and how
    many were cut."""
    if max_chars <= 0:
        return messages, 0
    out, cut = [], 0
    for message in messages:
        content = message["content"]
        if len(content) > max_chars:
            content, cut = content[:max_chars] + f"\n[... {len(content) - max_chars} characters cut]", cut + 1
        out.append({**message, "content": content})
    return out, cut


def render_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def observation_ids(tokenizer, messages: list[dict], observation: list[dict], generated: list[int]) -> list[int]:
    """Tokens the template places after the model's last turn (which ended with `generated`) up to the next
    generation prompt: whatever closes the assistant turn after its end-of-turn token, then the observation."""
    before = render_ids(tokenizer, messages, add_generation_prompt=False)
    after = render_ids(tokenizer, messages + observation, add_generation_prompt=True)
    if after[:len(before)] != before:
        raise ValueError("the chat template is not append-only for this conversation; observation tokens cannot "
                         "be derived by diffing renders")
    eos = tokenizer.eos_token_id
    turn_end = len(before) - before[::-1].index(eos) if eos in before else len(before)
    missing_eos = [eos] if generated[-1:] != [eos] else []  # a truncated turn is closed by the template's eos
    return missing_eos + after[turn_end:]


def token_classes(tokenizer, token_ids: list[int], text: str, syntax: Optional[list[bool]]) -> list[int]:
    """Per generated token: 1 when most of its non-space characters are tool-call syntax, else 0, -1 when
    the env cannot tell (or the token's text does not map onto `text` one to one, as with split multi-byte
    characters)."""
    unknown = [-1] * len(token_ids)
    if syntax is None:
        return unknown
    pieces = ["" if t == tokenizer.eos_token_id else tokenizer.decode([t]) for t in token_ids]
    if "".join(pieces) != text:
        return unknown
    classes, start = [], 0
    for piece in pieces:
        span = syntax[start:start + len(piece)]
        visible = [s for c, s in zip(piece, span) if not c.isspace()] or span  # whitespace does not decide
        classes.append(-1 if not span else int(2 * sum(visible) > len(visible)))
        start += len(piece)
    return classes


def generate_each(engine: InferenceEngine, episodes: list[Episode]) -> list:
    """The next turn of every episode in one batched call; a generation failure marks only the episodes it belongs
    to (their generation is None)."""
    results = generate_isolated(engine, [ep.prompt_ids + ep.response_ids for ep in episodes],
                                [ep.spec for ep in episodes])
    for ep, result in zip(episodes, results):
        if isinstance(result, Exception):
            ep.fail("generation", result)
    return [None if isinstance(result, Exception) else result for result in results]


def run_episodes(engine: InferenceEngine, tokenizer, episodes: list[Episode],
                 limits: EpisodeLimits = EpisodeLimits(), turns: str = "lockstep") -> None:
    """Advances all episodes to their end; an episode ends when its env says so, after its env's `max_turns` agent
    messages, or when its next turn would not fit `limits.context_tokens` (with the reward of its last step, as at
    its last allowed turn). An exception in the env or the engine fails that episode only (`Episode.error`). Env
    steps run concurrently, at most `limits.concurrent_env_steps` at a time (an env whose step waits on a tool, an
    API or a sandbox). `turns` (rollout.turns) names how turns are scheduled: TURN_SCHEDULES."""
    with ThreadPoolExecutor(max(1, limits.concurrent_env_steps), thread_name_prefix="env-step") as pool:
        for ep in episodes:
            ep.messages = [dict(m) for m in ep.task.messages]
            ep.prompt_ids = render_ids(tokenizer, ep.messages, add_generation_prompt=True)
            try:
                ep.env.reset(ep.task)
            except Exception as exc:  # noqa: BLE001 - any env fault fails this episode only
                ep.fail("env reset", exc)
        TURN_SCHEDULES[turns](engine, tokenizer, [ep for ep in episodes if not ep.done], limits, pool)


def _step(env: Env, text: str):
    """The env's reply to `text`, or the exception it raised."""
    try:
        return env.step(text)
    except Exception as exc:  # noqa: BLE001 - any env fault fails this episode only
        return exc


def _in_lockstep(engine: InferenceEngine, tokenizer, episodes: list[Episode], limits: EpisodeLimits,
                 pool: ThreadPoolExecutor) -> None:
    """Turn by turn: the running episodes' next turns in one batched generation, then their env steps; the next
    turn waits for the slowest step. A batch is made of the same episodes whatever the env steps' timing, so
    sampling is reproducible to the bit (an exact resume)."""
    for _ in range(max((ep.env.max_turns for ep in episodes), default=0)):
        active = [ep for ep in episodes if not ep.done]
        if not active:
            break
        generated = [(ep, gen) for ep, gen in zip(active, generate_each(engine, active)) if gen is not None]
        steps = [pool.submit(_step, ep.env, _record_turn(ep, gen, tokenizer)) for ep, gen in generated]
        for (ep, gen), future in zip(generated, steps):
            _after_step(ep, gen, future.result(), tokenizer, limits)


def _continuously(engine: InferenceEngine, tokenizer, episodes: list[Episode], limits: EpisodeLimits,
                  pool: ThreadPoolExecutor) -> None:
    """Each episode's next turn goes to the engine as soon as its env step returns, without waiting for the other
    episodes' steps (continuous batching across turns, for envs whose steps take long or vary). What is batched
    together then depends on the steps' timing, so the sampled tokens are not reproducible to the bit."""
    generating: dict[int, Episode] = {}
    stepping: dict[Future, tuple[Episode, Generation]] = {}

    def next_turn(ep: Episode) -> None:
        generating[id(ep)] = ep
        engine.submit(id(ep), ep.prompt_ids + ep.response_ids, ep.spec)

    for ep in episodes:
        next_turn(ep)
    while generating or stepping:
        for key, gen in engine.collect() if generating else []:
            ep = generating.pop(key)
            if isinstance(gen, Exception):
                ep.fail("generation", gen)
            else:
                stepping[pool.submit(_step, ep.env, _record_turn(ep, gen, tokenizer))] = ep, gen
        returned = [f for f in stepping if f.done()]
        if not returned and not generating and stepping:
            returned = list(wait(stepping, return_when=FIRST_COMPLETED).done)
        for future in returned:
            ep, gen = stepping.pop(future)
            if _after_step(ep, gen, future.result(), tokenizer, limits):
                next_turn(ep)


# rollout.turns: how the episodes' turns are scheduled.
TURN_SCHEDULES = {"lockstep": _in_lockstep, "continuous": _continuously}


def _after_step(ep: Episode, gen: Generation, result, tokenizer, limits: EpisodeLimits) -> bool:
    """Takes the env's reply (or the exception it raised) to the episode's last turn; whether it goes on."""
    if isinstance(result, Exception):
        ep.fail("env step", result)
        return False
    ep.info.update(result.info)
    ep.truncated = gen.finish_reason == "length"
    if result.done or len(ep.turn_spans) == ep.env.max_turns:
        ep.done, ep.reward = True, result.reward
        return False
    observation, cut = cut_observation(result.observation, limits.observation_chars)
    ep.observations_cut += cut
    obs = observation_ids(tokenizer, ep.messages, observation, gen.token_ids)
    used = len(ep.prompt_ids) + len(ep.response_ids) + len(obs) + ep.spec.max_new_tokens
    if limits.context_tokens is not None and used > limits.context_tokens:
        ep.done, ep.reward, ep.truncated, ep.context_full = True, result.reward, True, True
        return False
    ep.observation_texts.append("\n".join(m["content"] for m in observation))
    ep.messages += observation
    ep.response_ids += obs
    ep.loss_mask += [0] * len(obs)
    ep.logprobs += [0.0] * len(obs)
    ep.token_classes += [-1] * len(obs)
    return True


def _record_turn(ep: Episode, gen, tokenizer) -> str:
    """Appends a generated turn to the episode; returns its text for the env."""
    start = len(ep.response_ids)
    ep.response_ids += gen.token_ids
    ep.loss_mask += [1] * len(gen.token_ids)
    ep.logprobs += gen.logprobs
    ep.turn_spans.append((start, len(ep.response_ids)))
    # Special tokens such as <tool_call> carry meaning for the env; only the end-of-turn token is dropped.
    text = tokenizer.decode([t for t in gen.token_ids if t != tokenizer.eos_token_id])
    ep.messages.append({"role": "assistant", "content": text})
    ep.action_texts.append(text)
    ep.token_classes += token_classes(tokenizer, gen.token_ids, text, ep.env.syntax_mask(text))
    return text


def to_trajectory(ep: Episode, task_index: int, policy_version: int, attempts: int = 1) -> Trajectory:
    return Trajectory(task_id=ep.task.task_id, group_id=ep.group_id, prompt_ids=ep.prompt_ids,
                      response_ids=ep.response_ids, loss_mask=ep.loss_mask, turn_spans=ep.turn_spans,
                      rollout_logprobs=ep.logprobs, policy_version=policy_version, reward=ep.reward,
                      task_index=task_index, task_text=ep.task.user_text, action_texts=ep.action_texts,
                      observation_texts=ep.observation_texts, truncated=ep.truncated,
                      max_turn_tokens=ep.spec.max_new_tokens, token_classes=ep.token_classes, info=ep.info,
                      error=ep.error, attempts=attempts, context_full=ep.context_full,
                      observations_cut=ep.observations_cut)
