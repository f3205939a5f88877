"""nvllm's tests: unit/ and integration/ by the package they test, support/ for what several share."""
