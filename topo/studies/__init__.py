"""The studies, behind one small interface (topo/studies/base.py): name → study."""
from topo.studies import aqm, cc, experiment, fairness
from topo.studies.main import STUDY as MAIN

STUDIES = {study.name: study for study in (MAIN, cc.STUDY, fairness.STUDY, aqm.STUDY, experiment.STUDY)}
