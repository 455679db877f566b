DROP TABLE async_schedule;
