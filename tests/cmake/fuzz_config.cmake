# The preset parser under libFuzzer (built with -DQC_FUZZ=ON and clang only).
qc_add_fuzzer(fuzz_config SOURCES fuzz/fuzz_config.c LIBS qcconfig)
