def mx_cases(Case, Run):
    return []
