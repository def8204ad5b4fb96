# The JSON number rule (src/base/qc_json.h): non-finite numbers are null, for qc_json_number and
# for cJSON's printer; qc_json_valid's strictness.
qc_add_test(test_json SOURCES test_json.c LIBS qcbase PkgConfig::CJSON m LABELS cpu TIMEOUT 60)
