"""``python -m kinetic_airflow.cli``: the same as the ``kinetic-airflow`` console script."""

import sys

from kinetic_airflow.cli.main import main

sys.exit(main())
