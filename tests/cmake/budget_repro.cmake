# Budgets that keep their promises (issue 25, docs/RELIABILITY.md): an in-step out-of-memory
# changes no bits, --skip-oversized gives honest losses, a step without a scene is no step, and
# the emu fp16 repro under 120 MiB trains. Runs the qctrain binary on cpu-smoke's small settings.
qc_add_test(test_budget_repro SOURCES test_budget_repro.c LIBS qcbase LABELS cpu TIMEOUT 900
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_budget_repro qctrain)
