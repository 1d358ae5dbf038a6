import pytest

from accelerando.cluster import detect_topology
from accelerando.cluster.slurm import first_hostname, tasks_on_node


def test_plain_process_is_rank_0_of_1():
    topo = detect_topology({})
    assert (topo.rank, topo.world_size, topo.source) == (0, 1, "local")
    assert not topo.is_distributed


def test_torchrun_variables():
    env = {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x",
    }  # fmt: skip
    topo = detect_topology(env)
    assert (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size) == (3, 1, 4, 2)
    assert (topo.node_rank, topo.num_nodes, topo.main_address, topo.main_port) == (1, 2, "10.0.0.1", 1234)
    assert topo.source == "torchelastic"


def test_slurm_srun_task():
    env = {
        "SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
        "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_NUM_NODES": "3",
        "SLURM_STEP_NODELIST": "gpu[007-009]", "SLURM_JOB_ID": "42",
    }  # fmt: skip
    topo = detect_topology(env)
    assert (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size) == (5, 1, 6, 2)
    assert (topo.node_rank, topo.num_nodes, topo.main_address) == (2, 3, "gpu007")
    assert topo.main_port == 15042 and topo.source == "slurm"


def test_sbatch_without_srun_is_local():
    assert detect_topology({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}).source == "local"


def test_torchrun_inside_slurm_wins():
    env = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_ID": "0",
    }
    assert detect_topology(env).source == "torchelastic"


@pytest.mark.parametrize(
    "env",
    [
        {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
         "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
        {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1",
         "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
    ],
)  # fmt: skip
def test_mpi_families(env):
    topo = detect_topology({**env, "MASTER_ADDR": "node0"})
    assert (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size, topo.num_nodes) == (
        1,
        1,
        4,
        2,
        2,
    )
    assert topo.source == "mpi" and topo.main_address == "node0"


def test_bad_values_name_the_variable():
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        detect_topology({"RANK": "0", "WORLD_SIZE": "two", "LOCAL_RANK": "0"})
    with pytest.raises(ValueError, match="rank 5 is outside"):
        detect_topology({"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})


def test_slurm_list_parsing():
    assert first_hostname("node1,node2") == "node1"
    assert first_hostname("gpu[003-005,9],cpu1") == "gpu003"
    assert tasks_on_node("2(x3),1", 3) == 1
    assert tasks_on_node("4", 0) == 4
