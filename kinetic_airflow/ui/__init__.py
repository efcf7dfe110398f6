"""The Kinetic view in Airflow's UI (served by the plugin from the api-server)."""
