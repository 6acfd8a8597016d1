"""`code`: HumanEval+ / MBPP+ tasks scored by differential testing in a process sandbox.

`make_code(env_cfg, own)` is the registry factory; `sandbox.run_program` runs untrusted code; `benchmarks` loads the
data and compares outputs against the canonical solutions'."""
from lopd_ray.envs.code.benchmarks import MBPP_KNOWN_BROKEN, CodeChecker, CodeProblem, Verdict, load_problems
from lopd_ray.envs.code.env import CodeEnv, CodeTasks, build_program, extract_code, make_code
from lopd_ray.envs.code.sandbox import Output, RunResult, SandboxLimits, run_program

__all__ = ["MBPP_KNOWN_BROKEN", "CodeChecker", "CodeEnv", "CodeProblem", "CodeTasks", "Output", "RunResult",
           "SandboxLimits", "Verdict", "build_program", "extract_code", "load_problems", "make_code", "run_program"]
