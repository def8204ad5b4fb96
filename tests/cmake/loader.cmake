# The background loader (src/data/qc_loader.h) and the safetensors reader/writer.
qc_add_test(test_loader SOURCES test_loader.c LIBS qcdata PkgConfig::XXHASH LABELS cpu TIMEOUT 300)
qc_add_test(test_safetensors SOURCES test_safetensors.c LIBS qcdata LABELS cpu TIMEOUT 60)
