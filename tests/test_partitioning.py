"""Our murmur2 partitioner must put every key where Kafka's Java client (and aiokafka, and Faust) do."""

from __future__ import annotations

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st
from taskstream.connectors.partitioning import murmur2, partition_for


@given(st.binary(max_size=80))
def test_murmur2_agrees_with_aiokafka(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key) & 0xFFFFFFFF


@given(st.uuids().map(lambda u: str(u).encode()), st.integers(1, 64))
def test_task_ids_land_where_the_default_partitioner_puts_them(key: bytes, partitions: int) -> None:
    assert partition_for(key, partitions) == (aiokafka_murmur2(key) & 0x7FFFFFFF) % partitions


def test_known_values_from_the_java_client() -> None:
    # org.apache.kafka.common.utils.Utils.murmur2 on these UTF-8 strings (values from Kafka's own tests)
    assert murmur2(b"21") & 0xFFFFFFFF == (-973932308) & 0xFFFFFFFF
    assert murmur2(b"foobar") & 0xFFFFFFFF == (-790332482) & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") & 0xFFFFFFFF == (-985981536) & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-longer-string") & 0xFFFFFFFF == (-1486304829) & 0xFFFFFFFF
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") & 0xFFFFFFFF == (-58897971) & 0xFFFFFFFF
    assert murmur2(b"abc") & 0xFFFFFFFF == 479470107
