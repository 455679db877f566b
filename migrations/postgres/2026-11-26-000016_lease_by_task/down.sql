CREATE INDEX async_lease_node_idx ON async_lease (node_id);
