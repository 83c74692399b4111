"""Experiments of the Pavlovian paper (``docs/papers/pavlovian.md``), one module each: ``capacity``
(``assoc_capacity``), ``capacity_onehot`` (``assoc_capacity_onehot``), ``drift`` (``assoc_drift``),
``error_propagation`` (``assoc_error_propagation``), ``depth_width`` (``assoc_depth_width``) and
``mqar``; ``common`` holds what several of them share."""
