"""The engine every method and adjoint runs on: the forward solve
(:mod:`solve`), its one integration loop (:mod:`loop`) with the step-size
controller (:mod:`controller`), the outputs (:mod:`output`, :mod:`events`),
the ways the loop is compiled (:mod:`single_kernel`, :mod:`segments`,
:mod:`bounded_loop`), the dense output object (:mod:`dense`), the progress
meter (:mod:`progress`) and the method switch of ``method="auto"``
(:mod:`auto`)."""
