"""BFCL v4 multi-turn function calling (`bfcl_multiturn`): data, call parsing/execution, BFCL's checker, the env."""
from lopd_ray.envs.bfcl.calls import PARSERS, Call, ParsedCalls, ToolRuntime, get_parser
from lopd_ray.envs.bfcl.checker import CheckResult, check_multi_turn
from lopd_ray.envs.bfcl.data import BfclTaskSpec
from lopd_ray.envs.bfcl.env import BfclMultiTurnEnv, BfclMultiTurnTasks, make_bfcl_multiturn

__all__ = ["PARSERS", "BfclMultiTurnEnv", "BfclMultiTurnTasks", "BfclTaskSpec", "Call", "CheckResult", "ParsedCalls",
           "ToolRuntime", "check_multi_turn", "get_parser", "make_bfcl_multiturn"]
