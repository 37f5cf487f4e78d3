"""The wire contract: Avro schemas (avro/*.avsc), typed records for them, and the codec."""
