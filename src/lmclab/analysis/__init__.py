"""The paper's analyses (its Sections 3–4), one module per analysis:

- :mod:`~lmclab.analysis.taylor`: the Taylor-approximated barrier (Theorem 3.1);
- :mod:`~lmclab.analysis.alignment`: singular value spectra and the alignment R_γ (Theorem 4.1, F.1);
- :mod:`~lmclab.analysis.energy`: layer inputs, input–singular-vector energy, Theorem 4.2;
- :mod:`~lmclab.analysis.landscape`: the plane through three models and its loss landscape;
- :mod:`~lmclab.analysis.compose`: all of them on one trained model or one aligned pair.
"""
