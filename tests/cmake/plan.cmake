# The memory planner (src/plan): the simulation on hand-made programs, the search on a small
# QCNet's dry-run program at a range of budgets, the cost model (test_plan.c).
qc_add_test(test_plan SOURCES test_plan.c LIBS qcplan qcmodel qcdata m LABELS cpu TIMEOUT 120)
# Planning without a run (src/train/memory/plan_run.c, the planner session of qctrain plan and
# qctrain tune): predictions of a run's measured peak from the configuration alone, hardware
# figures, parameters and cost models per call, the largest batch, `qctrain plan --json`.
qc_add_test(test_planner SOURCES test_planner.c
    LIBS qctrainer qcplan qcmodel qcdata qcconfig PkgConfig::CJSON LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_planner qctrain)
# The cost model's calibration of this machine (src/plan/qc_plan_calib.h, src/train/memory/calib.c):
# the cache (round trip, corrupt and foreign files refused and probed again), the prediction
# with a calibration's rates, what `qctrain plan` says of its calibration and a run's refresh.
qc_add_test(test_calib SOURCES test_calib.c
    LIBS qcplan qcbase PkgConfig::CJSON m LABELS cpu TIMEOUT 300)
add_dependencies(test_calib qctrain)
