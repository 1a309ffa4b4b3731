"""Plugins: one module per plugin, the file name is the registry name in snake_case.

Filters (node_resources_fit, node_selector, device_fit), the openb paper's scoring policies
(random_score, dot_product, gpu_clustering, gpu_packing, best_fit, fgd) and kallot's default
policy (kallot_score).
"""
