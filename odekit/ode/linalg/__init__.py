"""The linear algebra every implicit method shares: Jacobians (:mod:`jacobian`;
sparse ones by compressed, colored forward mode in :mod:`sparsity`, their
patterns found from the traced function by :mod:`sparsity_detection`) and
dense LU factorisations with their solves (:mod:`lu`)."""
