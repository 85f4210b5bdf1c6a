"""Labels of a Dataset's auto-labeling: merging the reviewed ones into its source in the repository
(merge: `forgectl labels merge`)."""
