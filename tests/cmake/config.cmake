# The option table, presets (inheritance, cycles, every error message) and size parsing.
qc_add_test(test_config SOURCES test_config.c LIBS qcconfig PkgConfig::CJSON LABELS cpu TIMEOUT 60)
