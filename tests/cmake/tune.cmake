# qctrain tune (src/tune): the tuned preset loads, inherits its base and changes only tuned
# keys; training with it stays under the budget on a mixed epoch; nothing predicted over the
# budget is run; the choice is a function of the measurements (injected); a budget too small
# names the least that fits; --dry-run, bad arguments.
qc_add_test(test_tune SOURCES test_tune.c
    LIBS qctune qctrainer qcplan qcmodel qcdata qcconfig PkgConfig::CJSON LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_tune qctrain)
