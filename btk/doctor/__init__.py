"""``btk doctor``: what makes SageMaker training fail in its first minutes, checked before it costs time.

Read-only AWS calls, through boto3's usual credential chain, for one environment of
``environments.py`` and each of its profiles' planned instance type and count:

- :mod:`btk.doctor.quotas`: Service Quotas for SageMaker training (instance type, per job,
  across jobs, run time) and for FSx for Lustre (storage, file systems, throughput);
- :mod:`btk.doctor.bootstrap`: the CDK bootstrap of the environment's qualifier and its version;
- :mod:`btk.doctor.plan`: the training plan of an ``existing`` or ``reserve`` environment;
- :mod:`btk.doctor.deployed`: the deployed stack, its pipelines against a template, its
  training image in ECR and its failure topic's subscriptions.

Every check ends as one :class:`~btk.doctor.findings.Finding` (pass, warn or fail, the figure
found, the next step); :mod:`btk.doctor.aws` turns every AWS answer into a value or one line,
so a denied or throttled call costs its own check only. :mod:`btk.doctor.checks` runs them in
order. boto3 is imported only when a client is made.
"""
