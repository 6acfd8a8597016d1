"""The console stays quiet (other libraries at run.log_level, known-harmless messages dropped) while the run's log
file keeps everything from INFO up; lopd_ray's own lines reach stdout."""
import logging
import subprocess
import sys
import textwrap

EMIT = textwrap.dedent("""
    import logging, sys
    from lopd_ray.utils import logs
    logs.configure(sys.argv[1], sys.argv[2])
    logging.getLogger("vllm.engine").info("engine started with 1 GiB of KV cache")
    logging.getLogger("vllm.model_executor").warning("RotaryEmbedding: Failed to load weights")
    logging.getLogger("vllm.engine").warning("the engine ran out of KV cache blocks")
    logging.getLogger("torch._library.triton").warning("Triton not available, find_triton_kernels = []")
    logs.say("composer cold start: 40 steps ...")
""")


def emit(tmp_path, level: str) -> tuple[subprocess.CompletedProcess, str]:
    log_file = tmp_path / "logs" / "driver.log"
    proc = subprocess.run([sys.executable, "-c", EMIT, str(log_file), level], capture_output=True, text=True,
                          timeout=60, check=True)
    return proc, log_file.read_text()


def test_console_shows_real_warnings_and_own_lines_and_the_file_keeps_everything(tmp_path):
    proc, log = emit(tmp_path, "warning")
    assert proc.stdout == "composer cold start: 40 steps ...\n"
    assert proc.stderr == "WARNING vllm.engine: the engine ran out of KV cache blocks\n"
    for line in ("engine started with 1 GiB", "RotaryEmbedding: Failed to load weights",
                 "ran out of KV cache blocks", "composer cold start"):
        assert line in log, line
    assert "Triton not available" not in log  # dropped where it is logged: torch re-installs its own handlers


def test_log_level_info_shows_other_libraries_info_lines(tmp_path):
    proc, _ = emit(tmp_path, "info")
    assert "INFO vllm.engine: engine started" in proc.stderr and "RotaryEmbedding" not in proc.stderr


def test_a_line_said_while_a_progress_bar_runs_gets_a_line_of_its_own():
    """Seen in a terminal or a redirected file: the bar is cleared, the line written whole, the bar drawn again
    below it; a plain handler would glue the line to the bar."""
    import io

    from tqdm import tqdm

    from lopd_ray.utils.logs import AboveProgressBars

    for handler_class, own_line in ((AboveProgressBars, True), (logging.StreamHandler, False)):
        out = io.StringIO()
        logger = logging.getLogger(f"lopd_ray.test_bar.{handler_class.__name__}")
        logger.propagate = False
        handler = handler_class(out)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        with tqdm(total=2, file=out, desc="train", ascii=True) as bar:
            logger.warning("Checkpoint written.")
            bar.update(2)
        logger.removeHandler(handler)
        text = out.getvalue()
        assert ("\rCheckpoint written.\n" in text) is own_line, text
        assert "2/2" in text.splitlines()[-1], text  # the bar, drawn again below the line
