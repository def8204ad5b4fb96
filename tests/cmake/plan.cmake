# The memory planner (src/plan): the simulation on hand-made programs, the search on a small
# QCNet's dry-run program at a range of budgets, the cost model (test_plan.c).
qc_add_test(test_plan SOURCES test_plan.c LIBS qcplan qcmodel qcdata m LABELS cpu TIMEOUT 120)
