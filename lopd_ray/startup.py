"""The one start-up path of every command: the process settings, the config loaded and checked (schema, registries,
the keys the algorithm reads, model and env prompts), Ray connected, the GPU shares fitted to the cluster and the
resources checked; any problem is one `config error:` line before any actor starts."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Optional

from lopd_ray.config import Config, load_config
from lopd_ray.errors import (ActorLostError, ActorStartError, ConfigError, DiskFullError, NotLearningError,
                             RolloutError, RunInterrupted, StepStalledError)
from lopd_ray.preflight import (check_bundles_fit, check_free_space, check_input_files, check_model_and_env,
                                check_registries, check_resources, check_run_folder, check_unread_keys,
                                fit_to_cluster)
from lopd_ray.utils import logs
from lopd_ray.utils.run_storage import RunStorage
from lopd_ray.utils.runtime import apply_runtime_env, single_thread_torch


def start(recipe: Optional[str], overrides: list[str], groups: Callable[[Config], tuple[str, ...]],
          command_reads: tuple[str, ...] = (), check: Optional[Callable[[Config], None]] = None,
          connect: bool = True) -> tuple[Config, str]:
    """Returns the checked config and the model's HF directory. `groups(cfg)` names the actor groups the command
    creates (preflight.ACTOR_GROUPS; none: Ray is not started); `command_reads` the config sections the command
    reads whatever the algorithm; `check(cfg)` the command's own checks; without `connect`, everything but Ray and
    the resources is checked, and nothing is built (the model directory is then "builtin:<name>" for a builtin
    model not built yet)."""
    apply_runtime_env()
    single_thread_torch()
    cfg = load_config(recipe, overrides)
    resolve_output_dir(cfg)
    check_run_folder(cfg)  # before the log file is written
    check_free_space(cfg)
    logs.configure(logs.process_log_file(cfg.run_dir, "driver") if connect else None, cfg.run.log_level)
    check_registries(cfg)
    check_unread_keys(cfg, command_reads)
    if check is not None:
        check(cfg)
    check_input_files(cfg, groups(cfg))
    model_dir = check_model_and_env(cfg, groups(cfg), build=connect)
    if groups(cfg) and connect:
        available = connect_ray(cfg)
        check_resources(cfg, groups(cfg), available)
        check_bundles_fit(cfg, groups(cfg), node_resources())
    logs.adopt_library_loggers()
    return cfg, model_dir


# Ray unpacks a job's working_dir under its session's runtime_resources; the folder is deleted with the job.
JOB_WORKING_DIR_MARK = os.sep + "runtime_resources" + os.sep


def resolve_output_dir(cfg: Config) -> None:
    """run.output_dir (or, with a URI there, run.staging_dir) becomes absolute: every actor writes to the same place
    whatever its working directory; a relative one inside a Ray job's temporary working directory is refused, as
    the run's outputs would die with the job. A URI's filesystem must be reachable; a run to resume that is not
    staged here is fetched from it."""
    uri = cfg.run_uri
    key = "run.staging_dir" if uri else "run.output_dir"
    local = os.path.expanduser(cfg.run.staging_dir) if uri else cfg.run.output_dir
    cwd = os.getcwd()
    if not os.path.isabs(local) and JOB_WORKING_DIR_MARK in cwd + os.sep:
        raise ConfigError(f"{key}='{local}' is relative, and this command runs in a Ray job's temporary working "
                          f"directory ({cwd}), which is deleted with the job: give an absolute path on storage the "
                          f"cluster keeps (cluster/submit.sh passes its checkout's runs/), or a URI as run.output_dir")
    if uri is None:
        cfg.run.output_dir = os.path.abspath(local)
        return
    cfg.run.staging_dir = os.path.abspath(local)
    try:
        storage = RunStorage(uri, cfg.run_dir)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"run.output_dir='{cfg.run.output_dir}': no filesystem for this URI here ({exc}); install "
                          f"fsspec's package for its scheme (s3fs for s3://, gcsfs for gs://) or give a directory")
    if cfg.run.resume == "auto" and not os.path.exists(os.path.join(cfg.run_dir, "checkpoints", "latest")):
        storage.download()


CONNECT_TIMEOUT_S = 10.0


def check_reachable(address: str, key: str) -> None:
    """A HOST:PORT cluster address must answer within CONNECT_TIMEOUT_S: Ray itself retries a dead one forever."""
    import socket

    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # "auto", ray:// client addresses: Ray's own resolution
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(f"{key}={address}: no Ray cluster answers there ({exc.strerror or exc}): start one "
                          f"(cluster/start_head.sh) or fix the address; without {key} a run starts its own "
                          f"local cluster") from None


# Whether this process's command joined or started Ray (not a caller that had, such as a test): its one-line error
# then leaves Ray first, so that no line Ray forwards from an actor comes after it.
RAY_JOINED_HERE = []


def connect_ray(cfg: Config) -> dict[str, float]:
    """Joins the cluster named by `ray.address` or RAY_ADDRESS (set under `ray job submit`), else starts a new local
    one; then fits the config's GPU shares to it (`ray.accelerator`). Returns the cluster's resources."""
    import ray

    if not ray.is_initialized():
        RAY_JOINED_HERE.append(True)
        address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
        if address:
            check_reachable(address, "ray.address" if cfg.ray.address else "RAY_ADDRESS")
            ray.init(address=address, logging_level=logging.WARNING)
        else:  # a cluster of its own, never one that Ray recorded on this machine earlier (it may be gone)
            ray.init(address="local", num_cpus=cfg.ray.num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    available = ray.cluster_resources()
    dropped = fit_to_cluster(cfg, available)
    if dropped:
        print(f"ray.accelerator={cfg.ray.accelerator} and {available.get('GPU', 0):g} GPUs in the cluster: "
              f"{', '.join(dropped)} set to 0, every actor runs on CPU", flush=True)
    return available


def node_resources() -> list[dict[str, float]]:
    import ray

    return [node["Resources"] for node in ray.nodes() if node["Alive"]]


def recipe_and_overrides(argv: list[str], usage: str) -> tuple[Optional[str], list[str]]:
    """`[RECIPE.yaml] [key=value ...]`; -h/--help prints `usage` and exits."""
    if any(a in ("-h", "--help") for a in argv):
        print(usage)
        sys.exit(0)
    recipe = argv[0] if argv and "=" not in argv[0] else None
    return recipe, argv[1:] if recipe else argv


def add_recipe_argument(parser: argparse.ArgumentParser) -> None:
    """An argparse command's `RECIPE.yaml` as its first positional argument, before `key=value` overrides (every
    command's style); `--recipe RECIPE.yaml`, the older style, still works (see `settle_recipe`)."""
    parser.add_argument("recipe", nargs="?", metavar="RECIPE.yaml", help="recipe YAML (see recipes/)")
    parser.add_argument("--recipe", dest="recipe_flag", metavar="RECIPE.yaml", help=argparse.SUPPRESS)


def settle_recipe(args: argparse.Namespace, parser: argparse.ArgumentParser, default: Optional[str] = None) -> None:
    """Sets `args.recipe` (and `args.overrides`) from what `add_recipe_argument` parsed: a first word with '=' is an
    override; `--recipe R` stands for a first R, with one line on stderr saying so; no recipe is `default`, or an
    error when there is none."""
    if args.recipe is not None and "=" in args.recipe:
        args.overrides.insert(0, args.recipe)
        args.recipe = None
    if args.recipe_flag is not None:
        if args.recipe is not None:
            parser.error(f"two recipes, {args.recipe} and --recipe {args.recipe_flag}: give one, first")
        print(f"{parser.prog}: --recipe is deprecated, give the recipe first: {parser.prog} {args.recipe_flag} ...",
              file=sys.stderr, flush=True)
        args.recipe = args.recipe_flag
    if args.recipe is None:
        if default is None:
            parser.error(f"give the recipe first: {parser.prog} RECIPE.yaml ... (see recipes/)")
        args.recipe = default


# The errors a command reports as one line on stderr: (error, the line's prefix, exit code).
ONE_LINE_ERRORS = ((ConfigError, "config error", 2), (RolloutError, "rollout error", 1),
                   (ActorLostError, "actor lost", 1), (ActorStartError, "actor start", 1),
                   (DiskFullError, "disk full", 1), (StepStalledError, "step stalled", 1),
                   (NotLearningError, "not learning", 1), (RunInterrupted, "interrupted", 130))


def command(run: Callable[[list[str]], int]) -> Callable[[Optional[list[str]]], int]:
    """A command's `main(argv=None)`: runs `run(argv)`; an error of ONE_LINE_ERRORS becomes its one line on stderr
    (`config error: ...`, exit code 2; `rollout error:`, `actor lost:`, `actor start:`, `disk full:`, `step
    stalled:`, `not learning:`, exit code 1; `interrupted:`, exit code 130, also for a Ctrl-C the command did not name itself), its
    traceback goes to the log file."""
    def main(argv: Optional[list[str]] = None) -> int:
        try:
            return run(sys.argv[1:] if argv is None else argv)
        except KeyboardInterrupt as exc:
            return one_line(RunInterrupted("stopped by Ctrl-C"), exc)
        except tuple(error for error, _, _ in ONE_LINE_ERRORS) as exc:
            return one_line(exc, exc)
    return main


def one_line(error: Exception, cause: BaseException) -> int:
    """Prints `error` as its line of ONE_LINE_ERRORS; returns the exit code."""
    prefix, code = next((prefix, code) for kind, prefix, code in ONE_LINE_ERRORS if isinstance(error, kind))
    logs.to_log_file(f"{prefix}: {error}", cause)
    logs.console_off()
    if RAY_JOINED_HERE:
        import ray

        ray.shutdown()  # its forwarding of the actors' lines stops: the error stays the last line
    sys.stdout.flush()
    print(f"{prefix}: {error}", file=sys.stderr, flush=True)
    return code
