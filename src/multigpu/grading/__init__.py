"""The final assessment: its pass rule (:mod:`rules`), a bounded runner for untrusted scripts
(:mod:`runner`), the grader (:mod:`grader`), signed certificates (:mod:`certificates`) and the
``multigpu grade / keygen / verify / certify / calibrate`` commands (:mod:`cli`)."""
