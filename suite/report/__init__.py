"""``bench report``: figures and tables for papers from run folders alone.

``load`` finds and reads run folders, ``figures`` draws one figure per function (or says why
it cannot), ``render`` writes report.md and a self-contained report.html around them.
"""
