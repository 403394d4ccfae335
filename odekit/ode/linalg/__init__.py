"""The linear algebra every implicit method shares: Jacobians (:mod:`jacobian`)
and dense LU factorisations with their solves (:mod:`lu`)."""
