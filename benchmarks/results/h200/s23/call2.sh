timeout 280 python3 -m pytest -q -p no:cacheprovider -n 15 tests/test_cuda_graph_step.py tests/test_cuda_resident.py tests/test_fused.py -k "not kernel_products" -x
