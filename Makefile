# `make wheel`: every distribution of the workspace as a wheel in dist/ (the core, the ten adapters and pynox-ray).
# `pip install --find-links dist pynox-pydantic-ai` then installs from those files, and the frameworks
# from the package index. tests/test_wheels.py does exactly that in a fresh environment.
PYTHON ?= python3
DIST ?= dist
PACKAGES := packages/pynox-core packages/pynox-pydantic-ai packages/pynox-strands packages/pynox-smolagents \
	packages/pynox-monty packages/pynox-ray packages/pynox-mcp packages/pynox-langchain packages/pynox-jupyter \
	packages/pynox-openai-agents packages/pynox-autogen packages/pynox-adk

.PHONY: wheel clean
# Each package's build/ goes first: setuptools packs what it finds in build/lib*, files since deleted or excluded too.
wheel:
	rm -rf $(addsuffix /build,$(PACKAGES))
	$(PYTHON) -m pip wheel --quiet --no-deps --wheel-dir $(DIST) $(PACKAGES)

clean:
	rm -rf $(DIST)
