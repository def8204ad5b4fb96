# Graph building, collation and safetensors (src/data: qc_graph.h, qc_batch.h, qc_safetensors.h).
qc_add_test(test_graph SOURCES test_graph.c LIBS qcdata LABELS cpu TIMEOUT 120)
