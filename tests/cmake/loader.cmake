# The background loader (src/data/qc_loader.h) and the safetensors reader/writer. The loader
# test runs worker threads: labelled tsan so CI also runs it under ThreadSanitizer.
qc_add_test(test_loader SOURCES test_loader.c LIBS qcdata PkgConfig::XXHASH LABELS cpu tsan TIMEOUT 300)
qc_add_test(test_safetensors SOURCES test_safetensors.c LIBS qcdata LABELS cpu TIMEOUT 60)
