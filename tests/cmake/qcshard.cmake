# qcshard container: reader, writer, broken files (tests/data/qcshard_broken/), fuzzer.
qc_add_test(test_qcshard SOURCES test_qcshard.c LIBS qcdata PkgConfig::XXHASH m LABELS cpu TIMEOUT 120)
if(COMMAND qc_add_fuzzer)
    qc_add_fuzzer(fuzz_qcshard SOURCES fuzz/fuzz_qcshard.c LIBS qcdata)
endif()
