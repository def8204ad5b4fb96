# The option parser in process, and the built qctrain binary as a subprocess: help of every
# command, global options, exit codes.
qc_add_test(test_cli SOURCES test_cli.c LIBS qcsrc PkgConfig::CJSON LABELS cpu TIMEOUT 120)
add_dependencies(test_cli qctrain)
